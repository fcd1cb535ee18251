// Command driver drives a headless Chromium with chromedp for the browser
// tests, on requests from package headless over its stdin and stdout (one
// JSON object a line). It is a module of its own so that chromedp is not a
// requirement of github.com/replayd/replayd: a user's `go mod tidy` loads
// replayd's tests, and would otherwise carry chromedp into their go.sum.
//
// It starts Chromium (-chromium, -profile) on its first request and stops
// it, and exits, when its stdin closes.
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"log"
	"os"
	"sync"
	"time"

	"github.com/chromedp/chromedp"
)

// request is one command; reply answers the request of the same ID.
type request struct {
	ID      int64
	Op      string // "start", "tab", "navigate", "reload", "eval", "close"
	Tab     int64
	Arg     string        // the URL of navigate, the expression of eval
	Timeout time.Duration // 0: none
}

type reply struct {
	ID    int64
	Tab   int64           `json:",omitempty"`
	Value json.RawMessage `json:",omitempty"` // eval's result, by value; none: undefined
	Error string          `json:",omitempty"`
}

func main() {
	chromium := flag.String("chromium", "/usr/bin/chromium", "the Chromium executable")
	profile := flag.String("profile", "", "Chromium's user data directory")
	flag.Parse()
	log.SetFlags(0)

	alloc, allocCancel := chromedp.NewExecAllocator(context.Background(),
		chromedp.ExecPath(*chromium),
		chromedp.Headless,
		chromedp.NoSandbox,
		chromedp.DisableGPU,
		chromedp.NoFirstRun,
		chromedp.NoDefaultBrowserCheck,
		chromedp.Flag("disable-quic", true),
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		chromedp.Flag("disable-breakpad", true),
		chromedp.Flag("disable-dev-shm-usage", true),
		chromedp.Flag("disable-extensions", true),
		chromedp.Flag("disable-default-apps", true),
		chromedp.UserDataDir(*profile),
	)
	browser, cancel := chromedp.NewContext(alloc, chromedp.WithLogf(log.Printf))
	d := &driver{browser: browser, cancel: cancel, tabs: map[int64]*tab{}, out: json.NewEncoder(os.Stdout)}

	var wg sync.WaitGroup
	in := bufio.NewScanner(os.Stdin)
	in.Buffer(nil, 1<<24)
	for in.Scan() {
		var req request
		if err := json.Unmarshal(in.Bytes(), &req); err != nil {
			log.Fatalf("driver: bad request %q: %v", in.Text(), err)
		}
		wg.Go(func() { d.reply(d.do(req)) })
	}
	wg.Wait()
	d.mu.Lock()
	for _, t := range d.tabs {
		t.cancel()
	}
	d.mu.Unlock()
	cancel()
	allocCancel() // waits for Chromium to exit
}

type driver struct {
	browser context.Context
	cancel  context.CancelFunc

	mu   sync.Mutex // guards tabs, next, out
	tabs map[int64]*tab
	next int64
	out  *json.Encoder
}

type tab struct {
	ctx    context.Context
	cancel context.CancelFunc
}

func (d *driver) reply(r reply) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if err := d.out.Encode(r); err != nil {
		log.Fatalf("driver: write: %v", err)
	}
}

// first runs nothing on ctx, which starts the browser or opens the tab.
// The first Run binds them to ctx, so ctx must not carry a timeout; a
// watchdog that cancels it bounds the wait instead.
func first(ctx context.Context, cancel context.CancelFunc, timeout time.Duration) error {
	if timeout > 0 {
		watchdog := time.AfterFunc(timeout, cancel)
		defer func() { watchdog.Stop() }()
		err := chromedp.Do(ctx)
		if !watchdog.Stop() && err == nil {
			err = errors.New("timed out")
		}
		return err
	}
	return chromedp.Do(ctx)
}

func (d *driver) do(req request) reply {
	r := reply{ID: req.ID}
	fail := func(err error) reply { r.Error = err.Error(); return r }
	switch req.Op {
	case "start":
		if err := first(d.browser, d.cancel, req.Timeout); err != nil {
			return fail(err)
		}
		return r
	case "tab":
		ctx, cancel := chromedp.NewContext(d.browser, chromedp.WithNewBrowserContext())
		if err := first(ctx, cancel, req.Timeout); err != nil {
			cancel()
			return fail(err)
		}
		d.mu.Lock()
		d.next++
		r.Tab = d.next
		d.tabs[r.Tab] = &tab{ctx, cancel}
		d.mu.Unlock()
		return r
	}
	d.mu.Lock()
	t := d.tabs[req.Tab]
	if req.Op == "close" {
		delete(d.tabs, req.Tab)
	}
	d.mu.Unlock()
	if t == nil {
		return fail(fmt.Errorf("no tab %d", req.Tab))
	}
	ctx := t.ctx
	if req.Timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, req.Timeout)
		defer cancel()
	}
	var err error
	switch req.Op {
	case "close":
		t.cancel()
	case "navigate":
		err = chromedp.Do(ctx, chromedp.Navigate(req.Arg))
	case "reload":
		err = chromedp.Do(ctx, chromedp.Reload())
	case "eval":
		r.Value, err = chromedp.Run(ctx, chromedp.Evaluate[[]byte](req.Arg))
	default:
		err = fmt.Errorf("unknown op %q", req.Op)
	}
	if err != nil {
		return fail(err)
	}
	return r
}

// Package headless drives a headless Chromium for the browser tests,
// through a helper process: ./driver, a module of its own that holds
// chromedp. Keeping chromedp out of the root module keeps it out of a
// user's go.sum (`go mod tidy` loads the tests of the packages a module
// imports). Start builds the driver with the go command, from this tree
// (the workspace in go.work, or the driver's own go.mod), into a temporary
// directory it removes when the browser stops.
//
// The API follows chromedp's shape: a browser and its tabs are contexts;
// Start gives the browser, NewTab a tab of it, and Navigate, Reload and
// Evaluate act on a tab until the deadline of the context given.
package headless

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"runtime"
	"strings"
	"sync"
	"time"
)

// browser is the driver process and the requests it has not answered.
type browser struct {
	cmd   *exec.Cmd
	stdin io.WriteCloser
	done  chan struct{} // closed when the reader has seen the driver's stdout end

	mu      sync.Mutex // guards stdin's writes, next, pending, err
	next    int64
	pending map[int64]chan reply
	err     error // why the driver is gone
}

type request struct {
	ID      int64
	Op      string
	Tab     int64
	Arg     string
	Timeout time.Duration
}

type reply struct {
	ID    int64
	Tab   int64
	Value json.RawMessage
	Error string
}

type ctxKey struct{}

// target is what a context of this package carries: the browser, and the
// tab (0 for the browser itself).
type target struct {
	b   *browser
	tab int64
}

// driverDir is the driver's source directory.
func driverDir() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "driver")
}

// build compiles the driver into dir.
func build(dir string) (string, error) {
	path := filepath.Join(dir, "driver")
	cmd := exec.Command("go", "build", "-o", path, ".")
	cmd.Dir = driverDir()
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("build the Chromium driver in %s: %v\n%s", cmd.Dir, err, out)
	}
	return path, nil
}

// Start starts a headless Chromium (execPath) with its profile in
// profileDir and returns the context that stands for it, and a cancel
// that stops it and waits for its processes to exit. Driver logs go to
// logf. timeout bounds the start.
func Start(execPath, profileDir string, logf func(string, ...any), timeout time.Duration) (context.Context, context.CancelFunc, error) {
	dir, err := os.MkdirTemp("", "replayd-headless-")
	if err != nil {
		return nil, nil, err
	}
	started := false
	defer func() {
		if !started {
			os.RemoveAll(dir)
		}
	}()
	path, err := build(dir)
	if err != nil {
		return nil, nil, err
	}
	cmd := exec.Command(path, "-chromium", execPath, "-profile", profileDir)
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, nil, err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, nil, err
	}
	cmd.Stderr = logWriter{logf}
	if err := cmd.Start(); err != nil {
		return nil, nil, err
	}
	started = true // stop removes dir from here on
	b := &browser{cmd: cmd, stdin: stdin, done: make(chan struct{}), pending: map[int64]chan reply{}}
	go b.read(stdout)
	stop := sync.OnceFunc(func() {
		b.stop()
		os.RemoveAll(dir)
	})
	ctx := context.WithValue(context.Background(), ctxKey{}, target{b: b})
	if _, err := b.call(context.Background(), request{Op: "start", Timeout: timeout}); err != nil {
		stop()
		return nil, nil, fmt.Errorf("start Chromium (%s): %w", execPath, err)
	}
	return ctx, stop, nil
}

// read dispatches the driver's replies until its stdout ends.
func (b *browser) read(stdout io.Reader) {
	defer close(b.done)
	sc := bufio.NewScanner(stdout)
	sc.Buffer(nil, 1<<24)
	for sc.Scan() {
		var r reply
		if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
			continue
		}
		b.mu.Lock()
		ch := b.pending[r.ID]
		delete(b.pending, r.ID)
		b.mu.Unlock()
		if ch != nil {
			ch <- r
		}
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.err == nil {
		b.err = errors.New("the Chromium driver exited")
	}
	for id, ch := range b.pending {
		close(ch)
		delete(b.pending, id)
	}
}

// stop closes the driver's stdin, which stops Chromium and the driver,
// and waits for both, killing the driver after 20 seconds.
func (b *browser) stop() {
	b.mu.Lock()
	b.err = errors.New("the browser is stopped")
	b.stdin.Close()
	b.mu.Unlock()
	exited := make(chan struct{})
	go func() { b.cmd.Wait(); close(exited) }()
	select {
	case <-exited:
	case <-time.After(20 * time.Second):
		b.cmd.Process.Kill()
		<-exited
	}
	<-b.done
}

// call sends req and waits for its reply until ctx ends; ctx's deadline
// also bounds the request in the driver.
func (b *browser) call(ctx context.Context, req request) (reply, error) {
	if d, ok := ctx.Deadline(); ok && req.Timeout == 0 {
		if req.Timeout = time.Until(d); req.Timeout <= 0 {
			return reply{}, context.DeadlineExceeded
		}
	}
	ch := make(chan reply, 1)
	b.mu.Lock()
	if b.err != nil {
		b.mu.Unlock()
		return reply{}, b.err
	}
	b.next++
	req.ID = b.next
	b.pending[req.ID] = ch
	line, _ := json.Marshal(req)
	_, err := b.stdin.Write(append(line, '\n'))
	if err != nil {
		delete(b.pending, req.ID)
	}
	b.mu.Unlock()
	if err != nil {
		return reply{}, err
	}
	select {
	case r, ok := <-ch:
		if !ok {
			b.mu.Lock()
			defer b.mu.Unlock()
			return reply{}, b.err
		}
		if r.Error != "" {
			return r, errors.New(r.Error)
		}
		return r, nil
	case <-ctx.Done():
		b.mu.Lock()
		delete(b.pending, req.ID)
		b.mu.Unlock()
		return reply{}, ctx.Err()
	}
}

func from(ctx context.Context) (target, error) {
	t, ok := ctx.Value(ctxKey{}).(target)
	if !ok {
		return target{}, errors.New("headless: not a browser or tab context")
	}
	return t, nil
}

// NewTab opens a tab of the browser of ctx in a fresh browser context (no
// shared cache, cookies or connections), within timeout, and returns the
// context that stands for it and a cancel that closes it.
func NewTab(ctx context.Context, timeout time.Duration) (context.Context, context.CancelFunc, error) {
	t, err := from(ctx)
	if err != nil {
		return nil, nil, err
	}
	r, err := t.b.call(context.Background(), request{Op: "tab", Timeout: timeout})
	if err != nil {
		return nil, nil, err
	}
	tab := target{b: t.b, tab: r.Tab}
	tabCtx, cancel := context.WithCancel(context.WithValue(ctx, ctxKey{}, tab))
	return tabCtx, sync.OnceFunc(func() {
		cancel()
		ctx, stop := context.WithTimeout(context.Background(), 10*time.Second)
		defer stop()
		t.b.call(ctx, request{Op: "close", Tab: tab.tab})
	}), nil
}

func tabCall(ctx context.Context, op, arg string) (reply, error) {
	t, err := from(ctx)
	if err != nil {
		return reply{}, err
	}
	if t.tab == 0 {
		return reply{}, errors.New("headless: not a tab context")
	}
	return t.b.call(ctx, request{Op: op, Tab: t.tab, Arg: arg})
}

// Navigate loads url in the tab of ctx and waits for the page to load.
func Navigate(ctx context.Context, url string) error {
	_, err := tabCall(ctx, "navigate", url)
	return err
}

// Reload reloads the page in the tab of ctx and waits for it to load.
func Reload(ctx context.Context) error {
	_, err := tabCall(ctx, "reload", "")
	return err
}

// Evaluate evaluates the JavaScript expression in the tab of ctx and
// returns its value, JSON-decoded into a T. A result of undefined or null
// is an error unless T can be nil.
func Evaluate[T any](ctx context.Context, expr string) (T, error) {
	var v T
	r, err := tabCall(ctx, "eval", expr)
	if err != nil {
		return v, err
	}
	if len(r.Value) == 0 || string(r.Value) == "null" {
		switch reflect.TypeFor[T]().Kind() {
		case reflect.Pointer, reflect.Map, reflect.Slice, reflect.Interface:
			return v, nil
		}
		return v, fmt.Errorf("headless: %s is null or undefined", expr)
	}
	err = json.Unmarshal(r.Value, &v)
	return v, err
}

// logWriter passes the driver's stderr, line by line, to logf.
type logWriter struct{ logf func(string, ...any) }

func (w logWriter) Write(p []byte) (int, error) {
	for _, line := range strings.Split(strings.TrimRight(string(p), "\n"), "\n") {
		w.logf("chromium driver: %s", line)
	}
	return len(p), nil
}

package main_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/replayd/replayd/internal/headless"
)

// Chromium, through the browser module the server serves, with a token
// from params: events published with POST /publish arrive once, in order,
// also after the stream's token expired and the module fetched a fresh one.
// Runs whenever Chromium is found (headless.ExecPath); mandatory with
// REPLAYD_BROWSER_TESTS=1.
func TestBrowserModuleWithTokens(t *testing.T) {
	tab := chromium(t)
	d := start(t, nil, append(serveArgs(t, filepath.Join(t.TempDir(), "b.db")), "--retry", "100ms")...)
	// The page's params give a token that expires in 2 s, then fresh ones.
	short := token(t, time.Now().Add(2*time.Second), "room-*")
	fresh := token(t, farFuture(), "room-*")
	first := publish(t, d.base, "room-1", "b0", 0).Sequence
	// Any page of the server's origin will do: the module is imported
	// from there, as a page the server's users host would.
	script := fmt.Sprintf(`(async () => {
		const { subscribe } = await import("/replayd.js");
		window.got = []; window.tokens = 0;
		subscribe({sse: "/events", transport: "sse", topics: ["room-1"], cursor: %d,
			params: () => ({access_token: window.tokens++ === 0 ? %q : %q}),
			onEvent(ev) { window.got.push(ev.id); }});
		return true;
	})()`, first-1, short, fresh)
	ctx, cancel := context.WithTimeout(tab, 30*time.Second)
	defer cancel()
	if err := chromedp.Do(ctx, chromedp.Navigate(d.base+"/healthz")); err != nil {
		t.Fatal(err)
	}
	if _, err := chromedp.Run(ctx, chromedp.Evaluate[bool](script, chromedp.EvalAwaitPromise)); err != nil {
		t.Fatal(err)
	}
	want := []int64{first}
	waitGot := func(what string) { t.Helper(); pageGot(t, ctx, what, want) }
	waitGot("the replay")
	want = append(want, publish(t, d.base, "room-1", "b1", 1).Sequence)
	waitGot("a live event")
	// The server ends the stream at the token's expiry, a wall-clock time:
	// publish only after it, so the events cannot go out on the old stream.
	time.Sleep(time.Until(time.Now().Truncate(time.Second).Add(3 * time.Second)))
	for i := range 3 {
		want = append(want, publish(t, d.base, "room-1", fmt.Sprint("b", i+2), i).Sequence)
	}
	waitGot("events after the token expired")
	tokens, err := chromedp.Run(ctx, chromedp.Evaluate[int](`window.tokens`))
	if err != nil || tokens < 2 {
		t.Fatalf("the page asked params %d times (%v), want a fresh token after the expiry", tokens, err)
	}
}

// chromium starts a headless Chromium for the test and returns its tab;
// without Chromium the test is skipped (fails with REPLAYD_BROWSER_TESTS=1).
func chromium(t *testing.T) context.Context {
	t.Helper()
	exe := headless.ExecPath(t)
	profile, err := os.MkdirTemp("", "replayd-chromium")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(profile) })
	alloc, cancelAlloc := chromedp.NewExecAllocator(context.Background(), chromedp.ExecPath(exe),
		chromedp.Headless, chromedp.NoSandbox, chromedp.DisableGPU, chromedp.NoFirstRun,
		chromedp.NoDefaultBrowserCheck, chromedp.Flag("disable-dev-shm-usage", true), chromedp.UserDataDir(profile))
	t.Cleanup(cancelAlloc)
	tab, cancelTab := chromedp.NewContext(alloc)
	t.Cleanup(cancelTab)
	return tab
}

// pageGot waits until the page's window.got holds exactly want, failing
// the test if it holds more, or not within waitFor.
func pageGot(t *testing.T, ctx context.Context, what string, want []int64) {
	t.Helper()
	deadline := time.Now().Add(waitFor)
	for {
		got, err := chromedp.Run(ctx, chromedp.Evaluate[[]int64](`window.got`))
		if err != nil {
			t.Fatal(err)
		}
		if slices.Equal(got, want) {
			return
		}
		if len(got) > len(want) || time.Now().After(deadline) {
			t.Fatalf("%s: the page got %v, want %v", what, got, want)
		}
		time.Sleep(50 * time.Millisecond) // the page gives no signal to Go
	}
}

// Chromium, with its token in the replayd_token cookie and the browser
// module given no token at all: the page replaces the cookie with a fresh
// token while its stream is open; the stream ends when the old token
// expires, and the EventSource's own reconnect (its URL unchanged, the
// browser's current cookie) resumes with nothing lost, nothing twice.
func TestBrowserCookieTokenRefreshed(t *testing.T) {
	tab := chromium(t)
	d := start(t, nil, append(serveArgs(t, filepath.Join(t.TempDir(), "k.db")), "--retry", "100ms")...)
	exp := time.Now().Add(2 * time.Second).Truncate(time.Second).Add(time.Second)
	short, fresh := token(t, exp, "room-*"), token(t, farFuture(), "room-*")
	first := publish(t, d.base, "room-1", "k0", 0).Sequence
	ctx, cancel := context.WithTimeout(tab, 30*time.Second)
	defer cancel()
	if err := chromedp.Do(ctx, chromedp.Navigate(d.base+"/healthz")); err != nil {
		t.Fatal(err)
	}
	script := fmt.Sprintf(`(async () => {
		document.cookie = "replayd_token=%s; path=/; SameSite=Strict";
		const { subscribe } = await import("/replayd.js");
		window.got = [];
		subscribe({sse: "/events", transport: "sse", topics: ["room-1"], cursor: %d,
			onEvent(ev) { window.got.push(ev.id); }});
		return true;
	})()`, short, first-1)
	if _, err := chromedp.Run(ctx, chromedp.Evaluate[bool](script, chromedp.EvalAwaitPromise)); err != nil {
		t.Fatal(err)
	}
	want := []int64{first}
	pageGot(t, ctx, "the replay", want)
	want = append(want, publish(t, d.base, "room-1", "k1", 1).Sequence)
	pageGot(t, ctx, "a live event", want)
	refresh := fmt.Sprintf(`(() => { document.cookie = "replayd_token=%s; path=/; SameSite=Strict"; return true; })()`, fresh)
	if _, err := chromedp.Run(ctx, chromedp.Evaluate[bool](refresh)); err != nil {
		t.Fatal(err)
	}
	// Publish only after the old token's expiry, so the events cannot go
	// out on the old stream.
	time.Sleep(time.Until(exp.Add(time.Second)))
	for i := range 3 {
		want = append(want, publish(t, d.base, "room-1", fmt.Sprint("k", i+2), i).Sequence)
	}
	// They come on a new stream: the old one ended at the expiry, and
	// only the fresh cookie opens one now.
	pageGot(t, ctx, "events after the old token expired", want)
}

// Chromium, on a page of another origin than the server's (two listeners
// on 127.0.0.1, different ports), as docs/server.md shows it: the page
// imports /replayd.js from the server, which --allow-origin lets it do,
// and receives events. A fetch of the module from an origin not allowed
// gets no Access-Control-Allow-Origin, so a browser refuses it.
func TestBrowserModuleCrossOrigin(t *testing.T) {
	tab := chromium(t)
	app := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		io.WriteString(w, "<!doctype html><title>app</title>")
	}))
	t.Cleanup(app.Close)
	d := start(t, nil, append(serveArgs(t, filepath.Join(t.TempDir(), "x.db")), "--allow-origin", app.URL, "--retry", "100ms")...)
	first := publish(t, d.base, "pub-1", "x0", 0).Sequence
	ctx, cancel := context.WithTimeout(tab, 30*time.Second)
	defer cancel()
	if err := chromedp.Do(ctx, chromedp.Navigate(app.URL+"/")); err != nil {
		t.Fatal(err)
	}
	script := fmt.Sprintf(`(async () => {
		const { subscribe } = await import(%q);
		window.got = [];
		subscribe({sse: %q, transport: "sse", topics: ["pub-1"], cursor: %d,
			onEvent(ev) { window.got.push(ev.id); }});
		return true;
	})()`, d.base+"/replayd.js", d.base+"/events", first-1)
	if _, err := chromedp.Run(ctx, chromedp.Evaluate[bool](script, chromedp.EvalAwaitPromise)); err != nil {
		t.Fatalf("importing %s/replayd.js from the page at %s: %v", d.base, app.URL, err)
	}
	want := []int64{first}
	pageGot(t, ctx, "the replay", want)
	want = append(want, publish(t, d.base, "pub-1", "x1", 1).Sequence)
	pageGot(t, ctx, "a live event", want)

	for _, tc := range []struct{ origin, allow string }{{app.URL, app.URL}, {"http://127.0.0.1:1", ""}} {
		req, _ := http.NewRequest("GET", d.base+"/replayd.js", nil)
		req.Header.Set("Origin", tc.origin)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if got := resp.Header.Get("Access-Control-Allow-Origin"); resp.StatusCode != 200 || got != tc.allow || resp.Header.Get("Vary") != "Origin" {
			t.Errorf("GET /replayd.js from %s: %d, Access-Control-Allow-Origin %q, Vary %q; want 200, %q, Origin",
				tc.origin, resp.StatusCode, got, resp.Header.Get("Vary"), tc.allow)
		}
	}
}

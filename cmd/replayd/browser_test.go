package main_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
)

// Chromium, through the browser module the server serves, with a token
// from params: events published with POST /publish arrive once, in order,
// also after the stream's token expired and the module fetched a fresh one.
// Runs with REPLAYD_BROWSER_TESTS=1 (Chromium at /usr/bin/chromium or
// $REPLAYD_CHROMIUM).
func TestBrowserModuleWithTokens(t *testing.T) {
	if os.Getenv("REPLAYD_BROWSER_TESTS") != "1" {
		t.Skip("set REPLAYD_BROWSER_TESTS=1 to run the Chromium tests")
	}
	exe := os.Getenv("REPLAYD_CHROMIUM")
	if exe == "" {
		exe = "/usr/bin/chromium"
	}
	d := start(t, nil, append(serveArgs(t, filepath.Join(t.TempDir(), "b.db")), "--retry", "100ms")...)
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
	waitGot := func(what string) {
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
			time.Sleep(50 * time.Millisecond)
		}
	}
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

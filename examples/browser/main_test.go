package main

import (
	"context"
	"log/slog"
	"net"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/replayd/replayd/internal/headless"
)

// The page in headless Chromium, with the 16-digit ids of a real log: the
// cursor stays inside its card, and no id in the feed runs under its topic
// badge. Skips without Chromium, unless REPLAYD_BROWSER_TESTS=1.
func TestPageFitsClockIDs(t *testing.T) {
	const wait = 30 * time.Second
	browser, stop, err := headless.Start(headless.ExecPath(t), t.TempDir(), t.Logf, wait)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(stop)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- run(ctx, slog.New(slog.DiscardHandler), ln, filepath.Join(t.TempDir(), "events.db"), 20*time.Millisecond)
	}()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	})
	tab, closeTab, err := headless.NewTab(browser, wait)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(closeTab)
	tctx, tcancel := context.WithTimeout(tab, wait)
	defer tcancel()
	if err := headless.Navigate(tctx, "http://"+ln.Addr().String()+"/"); err != nil {
		t.Fatal(err)
	}
	// The text's own extent (a Range), not its box: a grid item keeps its
	// column's width when its text overflows it.
	const check = `(() => {
		const ext = el => { const r = document.createRange(); r.selectNodeContents(el); return r.getBoundingClientRect(); };
		const c = document.getElementById("cursor");
		const lis = document.querySelectorAll("#feed li");
		if (!/^\d{16}$/.test(c.textContent) || lis.length < 5) return null;
		const bad = [];
		const card = c.closest(".card").getBoundingClientRect();
		if (ext(c).right > card.right) bad.push("cursor " + c.textContent + " ends at " + ext(c).right + ", its card at " + card.right);
		for (const li of lis) {
			const id = ext(li.children[0]), tag = li.children[1].getBoundingClientRect();
			if (id.right > tag.left) bad.push(li.children[0].textContent + " ends at " + id.right + ", its badge starts at " + tag.left);
		}
		return bad;
	})()`
	deadline := time.Now().Add(wait)
	for {
		bad, err := headless.Evaluate[[]string](tctx, check)
		if err != nil {
			t.Fatal(err)
		}
		if bad != nil {
			if len(bad) > 0 {
				t.Fatalf("the page does not fit 16-digit ids:\n%s", strings.Join(bad, "\n"))
			}
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("the page shows no 16-digit cursor and 5 events")
		}
		time.Sleep(50 * time.Millisecond) // the page gives no signal to Go
	}
}

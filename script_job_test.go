package replayd

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

// followJob's logic under node, with the browser globals stubbed
// (testdata/followjob.mjs): a chunk replayed from an offset already held
// is cut to its new part, an event already held is dropped, a hole in the
// text or the events is a gap (and the text goes on, not padded), the
// state is stored, and a reload restores it at once and resumes from its
// cursor; the latest progress is kept and restored too; after the end a
// reload opens no connection. The browser test
// (TestBrowserFollowJob) runs the real thing in Chromium.
func TestClientScriptFollowJobLogic(t *testing.T) {
	node, err := exec.LookPath("node")
	if err != nil {
		t.Skip("node not found")
	}
	mod := filepath.Join(t.TempDir(), "replayd.mjs")
	if err := os.WriteFile(mod, clientJS, 0o600); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(node, filepath.Join("testdata", "followjob.mjs"), mod).CombinedOutput()
	if err != nil {
		t.Fatalf("node: %v\n%s", err, out)
	}
	const want = `[["text","hello ",0,false],["text","wor",6,false],["event",{"a":1},0,false],` +
		`["gap","text_missing",9,12],["text","d 😀",12,false],["gap","events_missing",1,2],["event",{"b":2},2,false],` +
		`["closed","hello word 😀",8,2],` +
		`["text","hello word 😀",0,true],["event",{"a":1},0,true],["event",{"b":2},2,true],` +
		`["gap","text_missing",9,12],["gap","events_missing",1,2],["url","8","jobs/j"],` +
		`["progress","generation",false],["text","!",16,false],["end","complete",false],["ended","hello word 😀!",2],` +
		`["text","hello word 😀!",0,true],["event",{"a":1},0,true],["event",{"b":2},2,true],["progress","generation",true],` +
		`["gap","text_missing",9,12],["gap","events_missing",1,2],["end","complete",true],["sources",2]]` + "\n"
	if string(out) != want {
		t.Fatalf("followJob under node:\n got %s\nwant %s", out, want)
	}
}

package main_test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/replayd/replayd/internal/wiretest"
)

// pollAll returns every event of topic from the start of the log, read by
// a poll with a token for *.
func pollAll(t *testing.T, d *daemon, topic string) wiretest.PollAnswer {
	t.Helper()
	q := "cursor=0&limit=1000&access_token=" + token(t, farFuture(), "*")
	if topic != "" {
		q += "&topic=" + topic
	}
	return wiretest.Poll(t, d.base, q)
}

// Publishing with curl, form-encoded and JSON, as a shell script or a PHP
// backend would.
func TestPublishWithCurl(t *testing.T) {
	curl := needTool(t, "curl")
	d := start(t, nil, serveArgs(t, filepath.Join(t.TempDir(), "c.db"))...)
	run := func(args ...string) string {
		t.Helper()
		out, err := exec.Command(curl, append([]string{"-sS", "-H", "Authorization: Bearer " + publishKey}, args...)...).CombinedOutput()
		if err != nil {
			t.Fatalf("curl %v: %v %s", args, err, out)
		}
		return string(out)
	}
	form := run("-d", "topic=room-1", "-d", "type=chat", "-d", "id=f1", "--data-urlencode", "data=hello & welcome", d.base+"/publish")
	formJSON := run("-d", "topic=room-1", "--data-urlencode", `data={"n":2}`, d.base+"/publish")
	asJSON := run("-H", "Content-Type: application/json", "--data", `{"topic":"room-1","id":"j1","data":[1,2,3]}`, d.base+"/publish")
	again := run("-d", "topic=room-1", "-d", "id=f1", "-d", "data=other", d.base+"/publish")
	for _, s := range []string{form, formJSON, asJSON} {
		if !strings.Contains(s, `"duplicate":false`) {
			t.Errorf("answer %s", s)
		}
	}
	if !strings.Contains(again, `"id":"f1","duplicate":true`) {
		t.Errorf("repeated id: %s", again)
	}
	p := pollAll(t, d, "room-1")
	var got []string
	for _, e := range p.Events {
		var v any
		if err := json.Unmarshal(e.Data, &v); err != nil {
			t.Fatal(err)
		}
		got = append(got, fmt.Sprintf("%s %v", e.Type, v))
	}
	want := []string{`chat hello & welcome`, `message map[n:2]`, `message [1 2 3]`}
	if strings.Join(got, "|") != strings.Join(want, "|") {
		t.Errorf("stored %q, want %q", got, want)
	}
}

// Publishing from Python's standard library (urllib), as a Django backend
// would.
func TestPublishWithPython(t *testing.T) {
	py := needTool(t, "python3")
	d := start(t, nil, serveArgs(t, filepath.Join(t.TempDir(), "p.db"))...)
	script := `
import json, sys, urllib.request, urllib.error
base, key = sys.argv[1], sys.argv[2]
def post(body, key=key):
    req = urllib.request.Request(base + "/publish", data=json.dumps(body).encode(),
        headers={"Authorization": "Bearer " + key, "Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req) as r:
            return r.status, json.load(r)
    except urllib.error.HTTPError as e:
        return e.code, json.load(e)
print(json.dumps([
    post({"topic": "room-py", "id": "py-1", "data": {"text": "héllo"}}),
    post([{"topic": "room-py", "data": i} for i in range(3)]),
    post({"topic": "room-py", "data": 1}, key="wrong"),
]))
`
	out, err := exec.Command(py, "-c", script, d.base, publishKey).Output()
	if err != nil {
		t.Fatalf("python: %v %s", err, out)
	}
	var res [][2]json.RawMessage
	if err := json.Unmarshal(out, &res); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	if string(res[0][0]) != "200" || !strings.Contains(string(res[0][1]), `"id": "py-1"`) && !strings.Contains(string(res[0][1]), `"id":"py-1"`) {
		t.Errorf("single: %s %s", res[0][0], res[0][1])
	}
	var batch []publishAnswer
	if err := json.Unmarshal(res[1][1], &batch); err != nil || string(res[1][0]) != "200" || len(batch) != 3 {
		t.Fatalf("batch: %s %s (%v)", res[1][0], res[1][1], err)
	}
	for i := 1; i < 3; i++ {
		if batch[i].Sequence != batch[i-1].Sequence+1 {
			t.Errorf("batch sequences %+v: want consecutive", batch)
		}
	}
	if string(res[2][0]) != "401" {
		t.Errorf("wrong key: %s %s", res[2][0], res[2][1])
	}
	p := pollAll(t, d, "room-py")
	var first struct{ Text string }
	if len(p.Events) != 4 || json.Unmarshal(p.Events[0].Data, &first) != nil || first.Text != "héllo" {
		t.Errorf("stored %+v", p.Events)
	}
}

// publishCodes is the code each 401 and 403 of TestPublishRefusals gets;
// the other refusals carry none.
var publishCodes = map[string]string{
	"no key":                           "key_missing",
	"unknown key":                      "key_unknown",
	"key prefix":                       "key_unknown",
	"topic outside the key's patterns": "topic_not_allowed",
	"broadcast without *":              "broadcast_not_allowed",
	"form topic outside the patterns":  "topic_not_allowed",
}

// Every refusal of POST /publish: its status and a JSON error.
func TestPublishRefusals(t *testing.T) {
	d := start(t, nil, append(serveArgs(t, filepath.Join(t.TempDir(), "r.db")), "--max-body", "2MiB")...)
	big := `{"data":"` + strings.Repeat("x", 1<<20) + `"}`
	huge := `{"data":"` + strings.Repeat("x", 3<<20) + `"}`
	for _, tc := range []struct {
		name, key, ctype, body string
		status                 int
	}{
		{"no key", "", "", `{"data":1}`, 401},
		{"unknown key", "nope", "", `{"data":1}`, 401},
		{"key prefix", publishKey[:3], "", `{"data":1}`, 401},
		{"topic outside the key's patterns", roomKey, "", `{"topic":"lobby","data":1}`, 403},
		{"broadcast without *", roomKey, "", `{"data":1}`, 403},
		{"form topic outside the patterns", roomKey, "application/x-www-form-urlencoded", `topic=lobby&data=1`, 403},
		{"not JSON", publishKey, "", `data=1`, 400},
		{"no data", publishKey, "", `{"topic":"a"}`, 400},
		{"form without data", publishKey, "application/x-www-form-urlencoded", `topic=a`, 400},
		{"unknown field", publishKey, "", `{"topics":"a","data":1}`, 400},
		{"bad topic", publishKey, "", `{"topic":"a\u0001","data":1}`, 400},
		{"bad type", publishKey, "", `{"type":"a\nb","data":1}`, 400},
		{"empty array", publishKey, "", `[]`, 400},
		{"array too long", publishKey, "", "[" + strings.TrimSuffix(strings.Repeat(`{"data":1},`, 1001), ",") + "]", 400},
		{"data over 1 MiB", publishKey, "", big, 413},
		{"body over --max-body", publishKey, "", huge, 413},
	} {
		t.Run(tc.name, func(t *testing.T) {
			status, b := post(t, http.DefaultClient, d.base, tc.key, tc.ctype, tc.body)
			var e publishAnswer
			if status != tc.status || json.Unmarshal(b, &e) != nil || e.Error == "" {
				t.Errorf("%d %.200s, want %d with a JSON error", status, b, tc.status)
			}
			if want := publishCodes[tc.name]; e.Code != want {
				t.Errorf("%d %.200s: code %q, want %q", status, b, e.Code, want)
			}
		})
	}
	if p := pollAll(t, d, ""); len(p.Events) != 0 {
		t.Errorf("refused publishes stored %d events", len(p.Events))
	}
	logs := d.logs.String()
	for _, code := range []string{"key_missing", "key_unknown", "topic_not_allowed", "broadcast_not_allowed"} {
		if !strings.Contains(logs, `"level":"INFO","msg":"publish refused","code":"`+code+`"`) {
			t.Errorf("no info line for %s in\n%s", code, logs)
		}
	}
	if strings.Contains(logs, `"nope"`) || strings.Contains(logs, roomKey) {
		t.Errorf("a key in the logs:\n%s", logs)
	}
	// An array: each item stored or refused on its own.
	status, b := post(t, http.DefaultClient, d.base, roomKey, "", `[{"topic":"room-1","data":1,"id":"a"},{"topic":"lobby","data":2},{"topic":"room-1","data":3,"id":"a"},{"topic":"room-2","type":"","data":4}]`)
	var items []publishAnswer
	if status != 200 || json.Unmarshal(b, &items) != nil || len(items) != 4 {
		t.Fatalf("array: %d %s", status, b)
	}
	if items[0].Error != "" || items[1].Error == "" || !items[2].Duplicate || items[2].Sequence != items[0].Sequence || items[3].Error != "" {
		t.Errorf("array answers: %s", b)
	}
	if p := pollAll(t, d, ""); len(p.Events) != 2 {
		t.Errorf("array stored %d events, want 2", len(p.Events))
	}
	resp, err := http.Get(d.base + "/publish")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 405 {
		t.Errorf("GET /publish: %d", resp.StatusCode)
	}
}

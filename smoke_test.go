package replayd

import (
	"net/http"
	"testing"
)

func TestSmoke(t *testing.T) {
	db, _ := openTestDB(t)
	h := newTestHub(t, db, Options{})
	srv := serve(t, h)
	for i := 0; i < 3; i++ {
		mustPublish(t, h, "a", map[string]int{"i": i})
	}
	c := dial(t, srv.URL+"?topic=a", http.Header{"Last-Event-ID": {"1"}})
	_, topic, cursor, head := c.hello()
	t.Logf("topic=%v cursor=%d head=%d", *topic, cursor, head)
	for _, f := range c.events(2) {
		t.Logf("%+v", f)
	}
	ev := mustPublish(t, h, "", "bcast")
	f := c.next()
	t.Logf("%+v %d", f, ev.Sequence)
	c2 := dial(t, srv.URL+"?topic=a", http.Header{"Last-Event-ID": {"0"}})
	c2.hello()
	t.Logf("%+v", c2.events(4))
}

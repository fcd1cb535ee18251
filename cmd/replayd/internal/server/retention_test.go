package server

import (
	"errors"
	"io"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/replayd/replayd"
)

// --retention-topic, by flag and by REPLAYD_RETENTION_TOPIC (white-space
// separated), in order; bad values are usage errors.
func TestRetentionTopicFlags(t *testing.T) {
	want := []replayd.TopicPolicy{
		{Topic: "telemetry.*", MaxAge: 10 * time.Minute},
		{Topic: "audit", MaxAge: 720 * time.Hour, MaxEvents: 1000000},
		{Topic: "config"},
	}
	args := []string{"--db", "x.db", "--retention-max-age", "24h",
		"--retention-topic", "telemetry.*=max-age=10m",
		"--retention-topic", "audit=max-age=720h,max-events=1000000",
		"--retention-topic", "config=keep"}
	c, err := ParseServe(args, func(string) string { return "" }, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(c.RetentionTopics, want) {
		t.Fatalf("flags: %+v, want %+v", c.RetentionTopics, want)
	}
	p, ok := c.retentionPolicy()
	if !ok || p.MaxAge != 24*time.Hour || !reflect.DeepEqual(p.Topics, want) {
		t.Fatalf("policy %+v %v", p, ok)
	}
	env := map[string]string{"REPLAYD_RETENTION_TOPIC": "telemetry.*=max-age=10m  audit=max-age=720h,max-events=1000000\tconfig=keep"}
	c, err = ParseServe([]string{"--db", "x.db"}, func(k string) string { return env[k] }, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(c.RetentionTopics, want) {
		t.Fatalf("environment: %+v, want %+v", c.RetentionTopics, want)
	}
	// Only keep entries: nothing to prune, no retention loop.
	c, err = ParseServe([]string{"--db", "x.db", "--retention-topic", "a=keep"}, func(string) string { return "" }, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := c.retentionPolicy(); ok {
		t.Fatal("a policy of keep entries alone prunes")
	}
	for _, bad := range []string{"a", "a=", "=keep", "a*b=keep", "a=max-age=0", "a=max-age=x", "a=max-events=-1", "a=keep,max-age=1s", "a=max-size=1"} {
		_, err := ParseServe([]string{"--db", "x.db", "--retention-topic", bad}, func(string) string { return "" }, io.Discard)
		var ue *UsageError
		if err == nil || !strings.Contains(err.Error(), "--retention-topic") || !errors.As(err, &ue) {
			t.Errorf("--retention-topic %q: %v, want a usage error", bad, err)
		}
	}
}

// Retention runs often enough for the shortest maximum age, per topic too.
func TestRetentionIntervalPerTopic(t *testing.T) {
	for _, tc := range []struct {
		p    replayd.RetentionPolicy
		want time.Duration
	}{
		{replayd.RetentionPolicy{}, time.Minute},
		{replayd.RetentionPolicy{MaxAge: time.Hour}, time.Minute},
		{replayd.RetentionPolicy{MaxAge: time.Hour, Topics: []replayd.TopicPolicy{{Topic: "a", MaxAge: 2 * time.Minute}}}, 30 * time.Second},
		{replayd.RetentionPolicy{Topics: []replayd.TopicPolicy{{Topic: "a", MaxAge: time.Second}}}, time.Second},
	} {
		if got := retentionInterval(tc.p); got != tc.want {
			t.Errorf("retentionInterval(%+v) = %v, want %v", tc.p, got, tc.want)
		}
	}
}

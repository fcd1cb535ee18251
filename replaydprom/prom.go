// Package replaydprom exports a replayd hub's metrics to Prometheus. It is
// a module of its own, so applications that do not use Prometheus never
// download its client.
//
//	reg := prometheus.NewRegistry()
//	if err := replaydprom.Register(reg, hub); err != nil { … }
//	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
//
// Every metric is read from the hub at scrape time ([replayd.EventHub.Metrics]
// and, for the head, [replayd.EventHub.LatestSequence]); nothing is recorded
// twice. Every label value exists from the start, at 0 until it happens, so
// rate() and alerts see a series before its first event. To put two hubs in
// one registry, wrap it with a label of your own:
//
//	replaydprom.Register(prometheus.WrapRegistererWith(prometheus.Labels{"hub": "a"}, reg), hubA)
package replaydprom

import (
	"context"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/replayd/replayd"
)

// Register registers a collector of h's metrics with reg (see the package
// docs for the names). It fails like reg.Register, for example when reg
// already has them.
func Register(reg prometheus.Registerer, h *replayd.EventHub) error {
	return reg.Register(&collector{h: h})
}

// headTimeout bounds the read of the head at each scrape.
const headTimeout = 2 * time.Second

var (
	publishedDesc = prometheus.NewDesc("replayd_events_published_total",
		"events stored by this hub; duplicates are not counted.", nil, nil)
	duplicatesDesc = prometheus.NewDesc("replayd_publish_duplicates_total",
		"publishes that stored nothing because their event id was known.", nil, nil)
	publishDurationDesc = prometheus.NewDesc("replayd_publish_duration_seconds",
		"time from a publish's hand-over to the writer to its answer: commit and live delivery.", nil, nil)
	headDesc = prometheus.NewDesc("replayd_head_sequence",
		"the log's head: the highest sequence ever assigned, read at scrape time.", nil, nil)
	connectionsDesc = prometheus.NewDesc("replayd_connections",
		"open sse streams and waiting long polls.", []string{"transport"}, nil)
	refusedDesc = prometheus.NewDesc("replayd_requests_refused_total",
		"sse and poll requests refused, by the answer they got.", []string{"reason"}, nil)
	replayedDesc = prometheus.NewDesc("replayd_replayed_events",
		"events replayed per sse connection, and per poll answer.", []string{"transport"}, nil)
	gapsDesc = prometheus.NewDesc("replayd_gaps_total",
		"gap frames sent, by reason.", []string{"reason"}, nil)
	slowDesc = prometheus.NewDesc("replayd_slow_consumer_disconnects_total",
		"connections cut off for passing max buffered bytes.", nil, nil)
	liveFramesDesc = prometheus.NewDesc("replayd_live_frames_total",
		"event frames queued to live connections.", nil, nil)
	prunedDesc = prometheus.NewDesc("replayd_pruned_events_total",
		"events deleted by retention.", nil, nil)
	tailPollsDesc = prometheus.NewDesc("replayd_tail_polls_total",
		"polls of the log by the tail.", nil, nil)
	pollMemoryDesc = prometheus.NewDesc("replayd_poll_memory_answers_total",
		"poll answers read from the window of the newest events, not from the log.", nil, nil)
	tailLagDesc = prometheus.NewDesc("replayd_tail_lag_seconds",
		"age of the newest row the tail delivered when it last found rows; 0 when caught up.", nil, nil)
)

type collector struct{ h *replayd.EventHub }

func (c *collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{
		publishedDesc, duplicatesDesc, publishDurationDesc, headDesc, connectionsDesc, refusedDesc,
		replayedDesc, gapsDesc, slowDesc, liveFramesDesc, prunedDesc, tailPollsDesc, tailLagDesc,
		pollMemoryDesc,
	} {
		ch <- d
	}
}

// Collect reads the hub at scrape time. The head takes a read of the log:
// if it fails, or takes longer than headTimeout, the scrape goes on without
// replayd_head_sequence, so the other metrics stay visible when the log is
// in trouble (alert on its absence).
func (c *collector) Collect(ch chan<- prometheus.Metric) {
	m := c.h.Metrics()
	counter := func(d *prometheus.Desc, v uint64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v), labels...)
	}
	gauge := func(d *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labels...)
	}
	histogram := func(d *prometheus.Desc, h replayd.Histogram, labels ...string) {
		buckets := make(map[float64]uint64, len(h.Bounds))
		for i, b := range h.Bounds {
			buckets[b] = h.Counts[i]
		}
		ch <- prometheus.MustNewConstHistogram(d, h.Count, h.Sum, buckets, labels...)
	}

	counter(publishedDesc, m.EventsPublished)
	counter(duplicatesDesc, m.PublishDuplicates)
	histogram(publishDurationDesc, m.PublishDuration)
	ctx, cancel := context.WithTimeout(context.Background(), headTimeout)
	head, err := c.h.LatestSequence(ctx)
	cancel()
	if err == nil {
		gauge(headDesc, float64(head))
	}
	gauge(connectionsDesc, float64(m.SSEConnections), "sse")
	gauge(connectionsDesc, float64(m.PollConnections), "poll")
	counter(refusedDesc, m.RefusedOverload, "overload")
	counter(refusedDesc, m.RefusedForbidden, "forbidden")
	counter(refusedDesc, m.RefusedUnauthenticated, "unauthenticated")
	counter(refusedDesc, m.RefusedOrigin, "origin")
	counter(refusedDesc, m.RefusedBadRequest, "bad_request")
	histogram(replayedDesc, m.ReplayedSSE, "sse")
	histogram(replayedDesc, m.ReplayedPoll, "poll")
	counter(gapsDesc, m.GapsReplayLimit, "replay_limit")
	counter(gapsDesc, m.GapsPruned, "pruned")
	counter(gapsDesc, m.GapsUnknownCursor, "unknown_cursor")
	counter(gapsDesc, m.GapsInvalidCursor, "invalid_cursor")
	counter(slowDesc, m.SlowConsumerDisconnects)
	counter(liveFramesDesc, m.LiveFrames)
	counter(prunedDesc, m.PrunedEvents)
	counter(tailPollsDesc, m.TailPolls)
	counter(pollMemoryDesc, m.PollsFromMemory)
	gauge(tailLagDesc, m.TailLag.Seconds())
}

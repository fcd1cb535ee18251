package main

import (
	"context"
	"fmt"
	"net/url"
	"strings"
)

// multitopicPhase (issue 9): fan-out to N clients that each hold 4 topics,
// against N clients holding 1, measured alternately (ABBA) in the same run,
// each on a fresh replayd server. Two cases:
//
//   - topic events: every event is published on "fan", the one topic all
//     clients share; a 4-topic client also holds 3 topics of its own among
//     100 others ("mt-00".."mt-99") that receive nothing, so the hub's
//     subscription maps hold 4 entries per stream.
//   - broadcasts: every event is a broadcast, which reaches a 4-topic stream
//     through each of its 4 subscriptions and must be queued once.
//
// The figure is frames/s, as in the fan-out phase: every client's frames
// over the time from the first publish until the last client has the last
// frame. Target: 4 topics ≥ 0.9× 1 topic (topic events).
func (b *bench) multitopicPhase(ctx context.Context) error {
	x := b.cfg.extra
	n := x.MultiClients
	events := max(x.MultiFrames/n, 10)
	single := func(int) string { return "/events?topic=fan" }
	multi := func(i int) string {
		q := url.Values{"topic": {"fan"}}
		for k := range 3 {
			q.Add("topic", fmt.Sprintf("mt-%02d", (i*3+k)%100))
		}
		return "/events?" + q.Encode()
	}
	for _, c := range []struct {
		name, topic string // topic "": broadcasts
		target      bool
	}{{"topic events", "fan", true}, {"broadcasts", "", false}} {
		var rates [2][]float64 // [single, multi]
		var cpu [2][]float64
		var failed error
		order := []int{0, 1, 1, 0} // ABBA
		if x.MultiPairs == 0 {
			order = []int{0, 1} // one of each (tiny)
		}
		for range max(x.MultiPairs, 1) {
			for _, k := range order {
				path := single
				if k == 1 {
					path = multi
				}
				var f fanout
				err := b.withDeadline(ctx, func(ctx context.Context) error {
					var err error
					f, err = b.scopedFanout(ctx, n, events, path, c.topic)
					return err
				})
				if err != nil {
					failed = err
					break
				}
				rates[k] = append(rates[k], f.rate)
				cpu[k] = append(cpu[k], f.cpuFrame)
			}
			if failed != nil {
				break
			}
		}
		r := row{Figure: fmt.Sprintf("fan-out, %s clients × 4 topics, %s × %s, frames/s", num(float64(n)), c.name, num(float64(events)))}
		if failed != nil {
			r.Replayd = "error: " + failed.Error()
			b.add(r)
			continue
		}
		r.Replayd = fmt.Sprintf("%s (%.2f µs server CPU/frame; runs %s)", num(mean(rates[1])), mean(cpu[1]), nums(rates[1]))
		r.Raw = fmt.Sprintf("1 topic: %s (%.2f µs; runs %s)", num(mean(rates[0])), mean(cpu[0]), nums(rates[0]))
		x, s := ratio(mean(rates[1]), mean(rates[0]))
		r.Ratio = s
		if c.target {
			r.Target, r.Status = "≥ 0.9× 1 topic", status(x >= 0.9)
		}
		b.add(r)
	}
	return nil
}

// scopedFanout is fanoutWith on a replayd server with client i requesting
// path(i), the events published on topic ("": broadcasts).
func (b *bench) scopedFanout(ctx context.Context, n, events int, path func(int) string, topic string) (fanout, error) {
	return b.fanoutWith(ctx, "hub", n, events, 16, path, topic)
}

func mean(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	var s float64
	for _, x := range xs {
		s += x
	}
	return s / float64(len(xs))
}

// nums formats xs as "a / b / c".
func nums(xs []float64) string {
	parts := make([]string, len(xs))
	for i, x := range xs {
		parts[i] = num(x)
	}
	return strings.Join(parts, " / ")
}

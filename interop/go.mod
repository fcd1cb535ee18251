module github.com/replayd/replayd/interop

go 1.26.0

require (
	github.com/launchdarkly/eventsource v1.11.0
	github.com/r3labs/sse/v2 v2.10.0
	github.com/replayd/replayd v0.1.0
	github.com/tmaxmax/go-sse v0.12.0
	gopkg.in/cenkalti/backoff.v1 v1.1.0
)

require (
	github.com/dustin/go-humanize v1.1.0 // indirect
	github.com/google/uuid v1.6.0 // indirect
	github.com/mattn/go-isatty v0.0.24 // indirect
	github.com/ncruces/go-strftime v1.1.0 // indirect
	github.com/remyoudompheng/bigfft v0.0.0-20230129092748-24d4a6f8daec // indirect
	golang.org/x/net v0.0.0-20191116160921-f9c825593386 // indirect
	golang.org/x/sys v0.49.0 // indirect
	modernc.org/libc v1.80.1 // indirect
	modernc.org/mathutil v1.7.1 // indirect
	modernc.org/memory v1.12.1 // indirect
	modernc.org/sqlite v1.62.0 // indirect
)

// The Durable Streams conformance harness installs its npm packages here
// (durable/README.md); no Go package is in them.
ignore ./durable/node_modules

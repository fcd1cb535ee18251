module github.com/replayd/replayd/replaydredis

go 1.26.0

require (
	github.com/redis/go-redis/v9 v9.23.0
	github.com/replayd/replayd v0.1.0
	go.uber.org/goleak v1.3.0
)

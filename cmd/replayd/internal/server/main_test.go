package server

import (
	"testing"

	"go.uber.org/goleak"
)

// No goroutine of the server outlives its Close.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

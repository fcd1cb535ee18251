//go:build race

package main_test

// Under -race the binary the tests run is built with the race detector too,
// so a data race in the server fails the test that provoked it (exit 66).
func init() { buildFlags = append(buildFlags, "-race") }

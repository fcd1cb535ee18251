package replayd

// Exported to this package's black-box tests (package replayd_test) only:
// test files are not part of the package.

// ChaosSeedFlag and ChaosDurationFlag are -chaos.seed and -chaos.duration,
// for TestChaos (chaos_sqlite_test.go).
var ChaosSeedFlag, ChaosDurationFlag = chaosSeedFlag, chaosDurationFlag

// Resync ends every open stream of h from inside the hub, as the hub does
// when it must resync its clients: chaostest.Config.Disconnect.
func Resync(h *EventHub) { h.live.Resync() }

// SetTestHookDetached sets the function called for each stream that
// detaches; nil: none. Set it only while no hub serves streams.
func SetTestHookDetached(f func()) { testHookDetached = f }

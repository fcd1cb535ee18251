package replayd

// Exported for the black-box tests of package replayd_test.

// SetTestHookDetached sets the function called for each stream that
// detaches; nil: none. Set it only while no hub serves streams.
func SetTestHookDetached(f func()) { testHookDetached = f }

package replaydpg

import (
	"github.com/replayd/replayd/storage"
)

// Store keeps replayd's storage contract (the storetest kit checks it) and
// wakes a tailing hub through LISTEN/NOTIFY.
var (
	_ storage.Store         = (*Store)(nil)
	_ storage.Notifier      = (*Store)(nil)
	_ storage.SchemaEnsurer = (*Store)(nil)
	_ storage.WriteProber   = (*Store)(nil)
)

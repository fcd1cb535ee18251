package replaydprom_test

import (
	"log"
	"net/http"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/replayd/replayd"
	"github.com/replayd/replayd/replaydprom"
)

// Serve a hub's metrics next to its stream; a second hub in the same
// registry gets a label of its own.
func ExampleRegister() {
	db, err := replayd.OpenDB("events.db")
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()
	hub, err := replayd.New(db, replayd.Options{})
	if err != nil {
		log.Fatal(err)
	}
	defer hub.Close()

	reg := prometheus.NewRegistry()
	if err := replaydprom.Register(reg, hub); err != nil {
		log.Fatal(err)
	}
	// For another hub: replaydprom.Register(
	//	prometheus.WrapRegistererWith(prometheus.Labels{"hub": "audit"}, reg), audit)

	mux := http.NewServeMux()
	mux.Handle("/events", hub.Handler())
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	mux.Handle("/readyz", hub.ReadyHandler())
	log.Fatal(http.ListenAndServe("127.0.0.1:8080", mux))
}

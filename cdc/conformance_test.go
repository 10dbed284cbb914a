package cdc_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outboxrelay/relay/cdc"
	"github.com/outboxrelay/relay/relay"
	"github.com/outboxrelay/relay/relay/relaytest"
)

// TestSourceConformance runs the relay core's Source suite on the WAL
// reader. Each subtest has its own database; its slot is named after it
// because slots belong to the cluster.
func TestSourceConformance(t *testing.T) {
	relaytest.RunSourceTests(t, func(t *testing.T, url string) relay.Source {
		cfg, err := pgx.ParseConfig(url)
		if err != nil {
			t.Fatal(err)
		}
		src, err := cdc.New(cdc.Config{
			DatabaseURL:       url,
			SlotName:          "slot_" + cfg.Database,
			HeartbeatInterval: 200 * time.Millisecond,
			StatusInterval:    100 * time.Millisecond,
			Logger:            testLogger(t),
		})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { src.Close(context.Background()) })
		return src
	})
}

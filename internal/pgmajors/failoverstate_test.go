package pgmajors_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/outboxrelay/relay/cdc"
	"github.com/outboxrelay/relay/internal/pgtest"
	"github.com/outboxrelay/relay/internal/testlog"
	"github.com/outboxrelay/relay/migrations"
	"github.com/outboxrelay/relay/relay"
)

// TestFailoverStateWithoutStandby: on PostgreSQL 17 the WAL reader creates
// its slot with failover unless told not to, and without a standby both
// slots are reported as not surviving a promotion, each for its reason;
// Source.Warnings reports it only for the reader that asked for a
// failover slot. A reader started with failover slots on gives an existing
// slot without the property that property. On 16 the server has no failover slots and nothing is
// reported.
func TestFailoverStateWithoutStandby(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	for _, major := range []int{16, failoverMajor} {
		c := startMajor(t, major, nil)
		admin := pgtest.Connect(t, c.URL())
		if _, err := admin.Exec(ctx, "CREATE DATABASE relay_state TEMPLATE template0"); err != nil {
			t.Fatal(err)
		}
		url := c.DatabaseURL("relay_state")
		conn := pgtest.Connect(t, url)
		pgtest.Migrate(t, conn, migrations.DefaultSchema)
		start := func(slot string, noFailover bool) *cdc.Source {
			src, err := cdc.New(cdc.Config{DatabaseURL: url, SlotName: slot, NoFailoverSlot: noFailover, Logger: testlog.New(t, 0)})
			if err != nil {
				t.Fatal(err)
			}
			if err := src.Start(ctx, relay.Position{}); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { src.Close(context.Background()) })
			return src
		}
		withFailover, without := start("with_failover", false), start("without_failover", true)
		a, err := cdc.SlotFailoverState(ctx, conn, "with_failover")
		if err != nil {
			t.Fatal(err)
		}
		b, err := cdc.SlotFailoverState(ctx, conn, "without_failover")
		if err != nil {
			t.Fatal(err)
		}
		if major < 17 {
			if a.Supported || a.Warning("with_failover") != "" || len(withFailover.Warnings(ctx)) != 0 {
				t.Fatalf("PostgreSQL %d: %+v, warnings %q", major, a, withFailover.Warnings(ctx))
			}
			continue
		}
		if !a.Supported || !a.Exists || !a.Failover || a.Standby || a.Synchronized() {
			t.Fatalf("the default slot: %+v", a)
		}
		if w := withFailover.Warnings(ctx); len(w) != 1 || !strings.Contains(w[0], "synchronized_standby_slots is empty") {
			t.Fatalf("the default slot's warnings: %q", w)
		}
		if !b.Exists || b.Failover || !strings.Contains(b.Warning("without_failover"), "has no failover property") {
			t.Fatalf("the slot made with NoFailoverSlot: %+v, %q", b, b.Warning("without_failover"))
		}
		if w := without.Warnings(ctx); len(w) != 0 {
			t.Fatalf("a reader that asked for no failover slot warns: %q", w)
		}
		// Started without NoFailoverSlot, a reader gives its existing slot
		// the failover property.
		if err := without.Close(ctx); err != nil {
			t.Fatal(err)
		}
		again, err := cdc.New(cdc.Config{DatabaseURL: url, SlotName: "without_failover", Logger: testlog.New(t, 0)})
		if err != nil {
			t.Fatal(err)
		}
		for err = again.Start(ctx, relay.Position{}); errors.Is(err, cdc.ErrSlotActive); err = again.Start(ctx, relay.Position{}) {
			time.Sleep(100 * time.Millisecond) // condition poll: the old walsender lets go of the slot
		}
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { again.Close(context.Background()) })
		if b, err = cdc.SlotFailoverState(ctx, conn, "without_failover"); err != nil || !b.Failover {
			t.Fatalf("after a start with failover slots on, the slot: %+v, %v", b, err)
		}
		if _, err := conn.Exec(ctx, "ALTER SYSTEM SET synchronized_standby_slots = 'absent_standby'"); err != nil {
			t.Fatal(err)
		}
		if _, err := conn.Exec(ctx, "SELECT pg_reload_conf()"); err != nil {
			t.Fatal(err)
		}
		waitUntil(t, ctx, "a warning naming the standby slot nobody streams from", func() bool {
			w := withFailover.Warnings(ctx)
			return len(w) == 1 && strings.Contains(w[0], "no standby streams from synchronized_standby_slots absent_standby")
		})
	}
}

package poller_test

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/outboxrelay/relay/internal/e2e"
	"github.com/outboxrelay/relay/internal/pgtest"
)

// TestDiskFull puts the broker's data directory on a small tmpfs and fills
// it: the relay must stop acknowledging, report not-ready, lose nothing,
// and resume by itself when space returns.
func TestDiskFull(t *testing.T) {
	if os.Geteuid() != 0 {
		if os.Getenv("CI") != "" {
			t.Fatal("the disk-full test mounts a tmpfs and needs root; CI runs as root")
		}
		t.Skip("mounting a tmpfs needs root")
	}
	url, bin := e2e.Migrated(t)
	mnt := t.TempDir()
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size=3m", "tmpfs", mnt).CombinedOutput(); err != nil {
		t.Fatalf("mount tmpfs: %v: %s", err, out)
	}
	t.Cleanup(func() { exec.Command("umount", "-l", mnt).Run() })
	dataDir := filepath.Join(mnt, "data")
	ledger := e2e.NewLedger()
	ctx := context.Background()

	relay := e2e.Start(t, bin, nil, runArgs(url, dataDir, e2e.FreeAddr(t), "--partitions", "1")...)
	e2e.WaitRole(t, relay, "leader", 30*time.Second)
	// About 6 MB of events into a 3 MB file system.
	if err := e2e.Write(ctx, e2e.WriterConfig{URL: url, Schema: "outbox", Topic: "orders", Writers: 2,
		Events: 12_000, Keys: 100, PerTx: 20, PayloadBytes: 500}, ledger); err != nil {
		t.Fatal(err)
	}
	// The disk fills: not ready, and the unpublished rows stay.
	deadline := time.Now().Add(time.Minute)
	for ready(relay) {
		if time.Now().After(deadline) {
			t.Fatal("still ready a minute after the disk filled")
		}
		time.Sleep(50 * time.Millisecond) // condition poll: readiness is another process's state
	}
	conn := pgtest.Connect(t, url)
	var left int
	if err := conn.QueryRow(ctx, "SELECT count(*) FROM outbox.events").Scan(&left); err != nil {
		t.Fatal(err)
	}
	if left == 0 {
		t.Fatal("every row was acknowledged although the log could not hold them")
	}
	t.Logf("disk full: not ready, %d rows waiting", left)
	time.Sleep(time.Second) // deliberate pause: the relay must stay up on a full disk for a while, not merely now
	if relay.Exited() {
		t.Fatalf("the relay exited on a full disk:\n%s", relay.Output())
	}
	// Space returns.
	if out, err := exec.Command("mount", "-o", "remount,size=64m", mnt).CombinedOutput(); err != nil {
		t.Fatalf("remount: %v: %s", err, out)
	}
	e2e.WaitDrained(t, url, "outbox", 2*time.Minute)
	deadline = time.Now().Add(30 * time.Second)
	for !ready(relay) {
		if time.Now().After(deadline) {
			t.Fatal("not ready again after space returned")
		}
		time.Sleep(50 * time.Millisecond) // condition poll: readiness is another process's state
	}
	relay.Stop(30 * time.Second)
	e2e.Check(t, e2e.ReadLog(t, dataDir, "orders"), ledger)
}

func ready(p *e2e.Proc) bool {
	ok, _ := p.Ready()
	return ok
}

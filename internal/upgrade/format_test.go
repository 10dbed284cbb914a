package upgrade_test

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/outboxrelay/relay/internal/broker"
	"github.com/outboxrelay/relay/internal/e2e"
)

// TestNewerDataDirRefused: the current relay, given a data directory whose
// meta.json records a format newer than it knows (as a later release
// would write), refuses it with one line naming both formats and leaves
// meta.json as it was.
func TestNewerDataDirRefused(t *testing.T) {
	url, bin := e2e.Migrated(t)
	dir := e2e.DataDir(t)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	meta := fmt.Sprintf(`{"version": %d, "log_id": "from-a-later-release", "next_producer_id": 1}`, broker.FormatVersion+1)
	path := filepath.Join(dir, "meta.json")
	if err := os.WriteFile(path, []byte(meta), 0o644); err != nil {
		t.Fatal(err)
	}
	p := e2e.Start(t, bin, nil, "run", "--database-url", url, "--data-dir", dir, "--http-addr", e2e.FreeAddr(t),
		"--kafka-addr", "", "--source", "poll")
	code := p.Wait(time.Minute)
	out := p.Output()
	want := fmt.Sprintf("has format %d, this relay reads formats up to %d", broker.FormatVersion+1, broker.FormatVersion)
	if code <= 0 || !strings.Contains(out, want) || strings.Contains(out, "goroutine ") {
		t.Fatalf("relay run on a newer data directory: exit %d, want a non-zero exit saying %q; output:\n%s", code, want, out)
	}
	if after, err := os.ReadFile(path); err != nil || string(after) != meta {
		t.Fatalf("meta.json after the refusal: %q, %v; want it unchanged", after, err)
	}
}

package broker

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func removeSnapshots(t testing.TB, dir string) {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if strings.HasSuffix(e.Name(), snapshotSuffix) {
			if err := os.Remove(filepath.Join(dir, e.Name())); err != nil {
				t.Fatal(err)
			}
		}
	}
}

// writeOut writes the segment bytes b buffers (writeback.go) to their
// files, without an fsync, for tests that read or damage the files of a
// running broker.
func writeOut(b *Broker) {
	if wb, ok := b.opts.FS.(writeBackFS); ok {
		wb.pool.writeOlder(time.Now().Add(time.Hour))
	}
}

package broker

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// appendTorn appends a torn frame (bytes no frame parses) to the file at
// path and returns the file's length before it.
func appendTorn(t *testing.T, path string) int64 {
	t.Helper()
	st, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.Write([]byte{0, 0, 0, 42, 1, 2, 3}); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	return st.Size()
}

// checkCut checks that the file at path is back to good bytes and that
// the cut tail was kept beside it.
func checkCut(t *testing.T, path string, good int64) {
	t.Helper()
	st, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if st.Size() != good {
		t.Errorf("%s is %d bytes after the reopen, want the %d good ones", path, st.Size(), good)
	}
	cuts, err := filepath.Glob(path + cutInfix + "*")
	if err != nil || len(cuts) != 1 {
		t.Fatalf("cut tails of %s: %v %v, want one", path, cuts, err)
	}
	if b, err := os.ReadFile(cuts[0]); err != nil || len(b) != 7 {
		t.Errorf("the cut tail holds %d bytes (%v), want the 7 torn ones", len(b), err)
	}
}

// TestFrameLogsCutATornTail: a torn frame at the end of the group
// offsets file or of the transaction state file (a crash in the middle of
// a write) is cut off and kept aside on open; what came before it is
// loaded, and later writes follow the good frames and survive a reopen.
func TestFrameLogsCutATornTail(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dir := t.TempDir()
	b := openWithTopic(t, dir, nil, "t", TopicConfig{Partitions: 1})
	if err := b.CommitOffsets(ctx, "g", []OffsetCommit{{Topic: "t", Partition: 0, Offset: 7}}); err != nil {
		t.Fatal(err)
	}
	id, err := b.InitTransactional(ctx, "x", 10*time.Second, ProducerID{ID: -1, Epoch: -1})
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	offsets := filepath.Join(dir, "groups", offsetsFile)
	state := filepath.Join(dir, "txns", txnStateFile)
	goodOffsets, goodState := appendTorn(t, offsets), appendTorn(t, state)

	b = openTest(t, dir, nil)
	checkCut(t, offsets, goodOffsets)
	checkCut(t, state, goodState)
	if c, ok := b.FetchOffset("g", "t", 0); !ok || c.Offset != 7 {
		t.Fatalf("offset after the cut: %+v %v, want 7", c, ok)
	}
	if err := b.CommitOffsets(ctx, "g", []OffsetCommit{{Topic: "t", Partition: 0, Offset: 9}}); err != nil {
		t.Fatal(err)
	}
	next, err := b.InitTransactional(ctx, "x", 10*time.Second, id)
	if err != nil {
		t.Fatal(err)
	}
	if next.ID != id.ID || next.Epoch != id.Epoch+1 {
		t.Fatalf("transactional id after the cut: %+v, want producer %d at epoch %d", next, id.ID, id.Epoch+1)
	}
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}

	b = openTest(t, dir, nil)
	defer b.Close()
	if c, ok := b.FetchOffset("g", "t", 0); !ok || c.Offset != 9 {
		t.Fatalf("offset after a write past the cut and a reopen: %+v %v, want 9", c, ok)
	}
	var found bool
	for _, st := range b.Transactions() {
		if st.TransactionalID == "x" {
			found = true
			if st.ProducerID != next.ID || st.Epoch != next.Epoch {
				t.Errorf("transaction state after a reopen: %+v, want %+v", st, next)
			}
		}
	}
	if !found {
		t.Errorf("transactional id x is gone after the reopen: %+v", b.Transactions())
	}
}

package broker

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"
)

// TestTopicChangesSurviveACrash: a deleted topic stays deleted in the
// crash model, and its batches, still in the journal, do not come back
// into a new topic of the same name (which the running broker refuses to
// create until it reopens); a partition increase is durable, and a
// record acknowledged on a new partition survives.
func TestTopicChangesSurviveACrash(t *testing.T) {
	t.Parallel()
	ffs := newInjectFS()
	dir := t.TempDir()
	b := openTest(t, dir, func(o *Options) { o.FS = ffs })
	mustCreate(t, b, "gone", TopicConfig{Partitions: 2})
	mustCreate(t, b, "grow", TopicConfig{Partitions: 2})
	rec := func(v string) []byte {
		return EncodeBatch(-1, -1, -1, []Record{{Key: []byte(v), Value: []byte(v), Timestamp: time.Now()}})
	}
	for i := range 10 {
		mustAppend(t, b, "gone", int32(i%2), rec(fmt.Sprint("g", i)))
		mustAppend(t, b, "grow", int32(i%2), rec(fmt.Sprint("w", i)))
	}
	if err := b.DeleteTopic("gone"); err != nil {
		t.Fatal(err)
	}
	if _, err := b.CreateTopic("gone", TopicConfig{Partitions: 2}); !errors.Is(err, ErrRecentlyDeleted) {
		t.Fatalf("recreating before a reopen: %v, want ErrRecentlyDeleted", err)
	}
	if _, err := b.AddPartitions("grow", 1); !errors.Is(err, ErrInvalidPartitions) {
		t.Fatalf("fewer partitions: %v, want ErrInvalidPartitions", err)
	}
	if _, err := b.AddPartitions("grow", 4); err != nil {
		t.Fatal(err)
	}
	mustAppend(t, b, "grow", 3, rec("on-a-new-partition"))

	c := openTest(t, ffs.crashCopy(t, dir), nil)
	if _, err := c.Topic("gone"); !errors.Is(err, ErrUnknownTopicOrPartition) {
		t.Fatalf("the deleted topic after a crash: %v", err)
	}
	mustCreate(t, c, "gone", TopicConfig{Partitions: 2})
	for p := range int32(2) {
		if start, end, _ := c.Offsets("gone", p); start != 0 || end != 0 {
			t.Fatalf("gone/%d recreated after the crash holds offsets %d-%d: the journal brought deleted records back", p, start, end)
		}
	}
	ti, err := c.Topic("grow")
	if err != nil || len(ti.Partitions) != 4 {
		t.Fatalf("grow after a crash: %v, %d partitions", err, len(ti.Partitions))
	}
	if rs := readAll(t, c, "grow", 3); len(rs) != 1 || string(rs[0].Value) != "on-a-new-partition" {
		t.Fatalf("grow/3 after a crash: %v", rs)
	}
	m, err := c.KeyMovement(context.Background(), "grow", 8)
	if err != nil || m.Keys != 11 {
		t.Fatalf("key movement: %+v, %v; want 11 keys", m, err)
	}
}

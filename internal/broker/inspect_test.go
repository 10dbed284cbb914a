package broker

import (
	"context"
	"os"
	"path/filepath"
	"reflect"
	"testing"
)

// Inspect reads the offsets file as the open does: a group's saved
// membership (the Kafka listener's coordinator state, a frame of partition
// -1 and no topic) is no committed offset, and deleted offsets and groups
// are gone. Inspect once indexed its topic's partitions by -1 for the
// membership frame and panicked as soon as a group had joined.
func TestInspectGroupsAsTheOpenReadsThem(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	b := openWithTopic(t, dir, nil, "orders", TopicConfig{Partitions: 2})
	mustAppend(t, b, "orders", 0, EncodeBatch(-1, -1, -1, recs("a", 5)))
	mustAppend(t, b, "orders", 1, EncodeBatch(-1, -1, -1, recs("b", 3)))
	ctx := context.Background()
	for _, g := range []string{"kept", "gone", "partly"} {
		if err := b.CommitOffsets(ctx, g, []OffsetCommit{{Topic: "orders", Partition: 0, Offset: 2}, {Topic: "orders", Partition: 1, Offset: 3}}); err != nil {
			t.Fatal(err)
		}
		if err := b.SaveGroupMembership(g, []byte("generation 1")); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := b.DeleteOffsets("gone", nil); err != nil {
		t.Fatal(err)
	}
	if _, err := b.DeleteOffsets("partly", []TopicPartition{{Topic: "orders", Partition: 1}}); err != nil {
		t.Fatal(err)
	}
	// A membership-only group (joined, never committed) shows nothing.
	if err := b.SaveGroupMembership("joined", []byte("generation 1")); err != nil {
		t.Fatal(err)
	}
	writeOut(b)

	check := func(when string) {
		t.Helper()
		ins, err := Inspect(ctx, dir)
		if err != nil {
			t.Fatalf("%s: %v", when, err)
		}
		if ins.OffsetsUnread != 0 && when != "with a torn tail" {
			t.Fatalf("%s: %d unread bytes of offsets", when, ins.OffsetsUnread)
		}
		type row struct {
			group     string
			partition int32
			committed int64
			lag       int64
		}
		var got []row
		for _, g := range ins.Groups {
			for _, p := range g.Partitions {
				if p.Topic != "orders" {
					t.Fatalf("%s: group %s has an offset of topic %q", when, g.Group, p.Topic)
				}
				got = append(got, row{g.Group, p.Partition, p.Committed, p.Lag})
			}
		}
		want := []row{{"kept", 0, 2, 3}, {"kept", 1, 3, 0}, {"partly", 0, 2, 3}}
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("%s: groups %+v, want %+v", when, got, want)
		}
	}
	check("while open")
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	check("after close")

	// A torn frame at the end (a commit being written) is left out.
	path := filepath.Join(dir, "groups", offsetsFile)
	frame := appendOffsetFrame(nil, groupKey{"torn", "orders", 0}, CommittedOffset{Offset: 1})
	f, err := os.OpenFile(path, os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.Write(frame[:len(frame)-1]); err != nil {
		t.Fatal(err)
	}
	f.Close()
	check("with a torn tail")
	if ins, err := Inspect(ctx, dir); err != nil || ins.OffsetsUnread != len(frame)-1 {
		t.Fatalf("unread offsets bytes %d, %v; want %d", ins.OffsetsUnread, err, len(frame)-1)
	}
}

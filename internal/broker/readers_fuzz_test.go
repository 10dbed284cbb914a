package broker

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"reflect"
	"sort"
	"testing"
	"time"
)

// The fuzz targets below feed arbitrary bytes to the readers of the files
// `relay topics`, `relay groups` and `relay log dump` open (Inspect and
// Dump): meta.json, groups/offsets.log, a partition's segment, lost.json
// and log-start. None may panic; what they read must agree with what a
// broker opened on the same directory holds.

const fuzzMeta = `{"version":1,"next_producer_id":1,"topics":{"z":{"partitions":2,"retention_ms":-1,"retention_bytes":-1,"cleanup_policy":"delete","segment_bytes":1073741824,"segment_ms":604800000,"delete_retention_ms":86400000,"max_message_bytes":1048588}}}`

// fuzzDir writes a data directory of topic z (2 partitions) whose
// partition 0 holds segment and, when not nil, lost and logStart.
func fuzzDir(t *testing.T, meta string, segment, lost, logStart []byte) string {
	t.Helper()
	dir := t.TempDir()
	for p := range int32(2) {
		if err := os.MkdirAll(partitionDir(dir, "z", p), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	pdir := partitionDir(dir, "z", 0)
	files := map[string][]byte{filepath.Join(dir, metaFile): []byte(meta), segmentName(pdir, 0, logSuffix): segment}
	if lost != nil {
		files[filepath.Join(pdir, lostFile)] = lost
	}
	if logStart != nil {
		files[filepath.Join(pdir, logStartFile)] = logStart
	}
	for path, data := range files {
		if err := os.WriteFile(path, data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

func fuzzSegment() []byte {
	seg := EncodeBatch(5, 0, 0, recs("a", 3))
	next := EncodeBatch(5, 0, 3, recs("b", 2))
	setBaseOffset(next, 3)
	return append(seg, next...)
}

// FuzzInspectOffsets: whatever groups/offsets.log holds, Inspect shows
// exactly the committed offsets a broker opened on the directory has.
func FuzzInspectOffsets(f *testing.F) {
	now := time.UnixMilli(1_700_000_000_000)
	commit := appendOffsetFrame(nil, groupKey{"g", "z", 0}, CommittedOffset{Offset: 2, CommitTime: now, Metadata: "m"})
	member := appendOffsetFrame(nil, membershipKey("g"), CommittedOffset{CommitTime: now, Metadata: "members"})
	deleted := appendOffsetFrame(nil, groupKey{"g", "z", 0}, CommittedOffset{Offset: deletedOffset, CommitTime: now})
	other := appendOffsetFrame(nil, groupKey{"h", "gone", 7}, CommittedOffset{Offset: 9, CommitTime: now})
	f.Add([]byte{})
	f.Add(commit)
	f.Add(append(append([]byte(nil), member...), commit...))
	f.Add(append(append(append([]byte(nil), commit...), member...), deleted...))
	f.Add(append(append([]byte(nil), other...), commit[:len(commit)-3]...))
	f.Add(appendOffsetFrame(nil, groupKey{"", "", -7}, CommittedOffset{Offset: 1}))
	f.Fuzz(func(t *testing.T, offsets []byte) {
		dir := fuzzDir(t, fuzzMeta, fuzzSegment(), nil, nil)
		if err := os.MkdirAll(filepath.Join(dir, "groups"), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, "groups", offsetsFile), offsets, 0o644); err != nil {
			t.Fatal(err)
		}
		ins, err := Inspect(context.Background(), dir)
		if err != nil {
			t.Fatalf("inspect: %v", err)
		}
		got := map[string][]GroupOffset{}
		for _, g := range ins.Groups {
			for _, p := range g.Partitions {
				if p.Partition == 0 && p.Topic == "z" && p.Lag != max(5-max(p.Committed, 0), 0) {
					t.Fatalf("group %s: lag %d at offset %d of 5", g.Group, p.Lag, p.Committed)
				}
				got[g.Group] = append(got[g.Group], GroupOffset{Topic: p.Topic, Partition: p.Partition,
					CommittedOffset: CommittedOffset{Offset: p.Committed, Metadata: p.Metadata, CommitTime: p.CommitTime}})
			}
		}
		// What a broker's open loads (it cuts a torn tail aside, so it
		// comes after Inspect).
		gs, err := openGroupStore(OSFS{}, filepath.Join(dir, "groups"), 1<<20, quietLogger(), nil)
		if err != nil {
			t.Fatalf("open group store: %v", err)
		}
		defer gs.close()
		want := map[string][]GroupOffset{}
		for k, c := range gs.offsets {
			c.LeaderEpoch = 0
			want[k.group] = append(want[k.group], GroupOffset{Topic: k.topic, Partition: k.partition, CommittedOffset: c})
		}
		for _, list := range want {
			sort.Slice(list, func(i, j int) bool {
				if list[i].Topic != list[j].Topic {
					return list[i].Topic < list[j].Topic
				}
				return list[i].Partition < list[j].Partition
			})
		}
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("inspect shows %+v, the broker has %+v", got, want)
		}
	})
}

// FuzzInspectMeta: a meta.json of any content is read or refused, never a
// panic, by Inspect and Dump.
func FuzzInspectMeta(f *testing.F) {
	f.Add([]byte(fuzzMeta))
	f.Add([]byte{})
	f.Add([]byte(`{"topics":{"z":{"partitions":2000000000}}}`))
	f.Add([]byte(`{"topics":{"../..":{"partitions":1}}}`))
	f.Add([]byte(`{"topics":{"z":{"partitions":-3}}}`))
	f.Add([]byte(`{"topics":null}`))
	f.Add([]byte(`[]`))
	f.Fuzz(func(t *testing.T, meta []byte) {
		dir := fuzzDir(t, string(meta), fuzzSegment(), nil, nil)
		ins, err := Inspect(context.Background(), dir)
		if err == nil {
			for _, ti := range ins.Topics {
				if int32(len(ti.Partitions)) != max(ti.Config.Partitions, 0) {
					t.Fatalf("topic %s: %d partitions inspected of %d", ti.Name, len(ti.Partitions), ti.Config.Partitions)
				}
			}
		}
		_ = Dump(context.Background(), &bytes.Buffer{}, DumpOptions{DataDir: dir})
	})
}

// FuzzReadPartition: a partition's segment, lost.json and log-start of any
// content are read or refused, never a panic, by Inspect and Dump (text
// and JSON), and Inspect's offsets stay ordered.
func FuzzReadPartition(f *testing.F) {
	seg := fuzzSegment()
	marker := markerBatch(5, 0, true, 1_700_000_000_000)
	setBaseOffset(marker, 5)
	f.Add(seg, []byte(nil), []byte(nil))
	f.Add(append(append([]byte(nil), seg...), marker...), []byte(nil), []byte("2\n"))
	f.Add(seg[:40], []byte(`{"version":1,"lost":[{"first":0,"last":2,"segment":0,"pos":0,"size":30}]}`), []byte(nil))
	f.Add(seg, []byte(`{"version":1,"lost":[{"first":3,"last":-1,"segment":0,"pos":-5,"size":9223372036854775807}]}`), []byte("-1"))
	f.Add(seg, []byte(`{"lost":[{"segment":0,"pos":99999,"size":1}]}`), []byte("99"))
	f.Add([]byte{}, []byte("{"), []byte(""))
	f.Fuzz(func(t *testing.T, segment, lost, logStart []byte) {
		dir := fuzzDir(t, fuzzMeta, segment, lost, logStart)
		ins, err := Inspect(context.Background(), dir)
		if err == nil {
			pi := ins.Topics[0].Partitions[0]
			if pi.LogStartOffset < 0 || pi.LogStartOffset > pi.HighWatermark || pi.HighWatermark != pi.LogEndOffset {
				t.Fatalf("inspected offsets out of order: %+v", pi)
			}
		}
		for _, format := range []string{"text", "json"} {
			_ = Dump(context.Background(), &bytes.Buffer{}, DumpOptions{DataDir: dir, Partition: -1, Format: format})
		}
	})
}

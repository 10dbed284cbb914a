package broker

import (
	"context"
	"fmt"
	"math/rand"
	"os/exec"
	"strings"
	"testing"
)

func TestOffsetMapBoundedAndExact(t *testing.T) {
	t.Parallel()
	m, err := newOffsetMap(100 << 10) // 4,266 slots
	if err != nil {
		t.Fatal(err)
	}
	defer m.free()
	room := func(n int) bool {
		ok, err := m.room(n)
		if err != nil {
			t.Fatal(err)
		}
		return ok
	}
	want := map[keyHash]int64{}
	n := 0
	for ; room(1); n++ {
		h := hashKey([]byte(fmt.Sprint("k", n%5000)))
		m.put(h, int64(n))
		want[h] = int64(n)
	}
	if len(m.slots) != 100<<10/offsetSlotBytes || m.used != len(want) || float64(m.used) > offsetMapLoadLimit*float64(len(m.slots)) {
		t.Fatalf("full map: %d slots, %d used, %d keys after %d puts", len(m.slots), m.used, len(want), n)
	}
	for h, off := range want {
		if got, ok := m.get(h); !ok || got != off {
			t.Fatalf("get %x: %d %v, want %d", h, got, ok, off)
		}
	}
	if _, ok := m.get(hashKey([]byte("absent"))); ok {
		t.Fatal("found a key never put")
	}
	m.reset()
	if _, ok := m.get(hashKey([]byte("k1"))); ok || m.used != 0 || !room(10) {
		t.Fatal("reset left entries")
	}
	// One batch of more records than the bound holds still gets room.
	if !room(len(m.slots) * 2) {
		t.Fatal("an empty map refused one batch")
	}
}

// Compaction with a key map far smaller than the keys takes several
// passes and leaves exactly what one pass with a large map leaves: the
// newest record of every key, tombstones kept (not old enough) and the
// keys they delete gone, every offset in place.
func TestCompactionInPassesMatchesOnePass(t *testing.T) {
	t.Parallel()
	clock := &fakeClock{}
	clock.ms.Store(1_700_000_000_000)
	dir := t.TempDir()
	cfg := TopicConfig{CleanupPolicy: CleanupCompact, SegmentBytes: 16 << 10, DeleteRetentionMs: 3_600_000}
	b := openWithTopic(t, dir, func(o *Options) { o.Now = clock.now }, "c", cfg)
	rng := rand.New(rand.NewSource(1))
	const keys = 3000
	newest := map[string]string{}
	for i := 0; i < 300; i++ {
		var rs []Record
		for j := 0; j < 40; j++ {
			k := fmt.Sprint("key-", rng.Intn(keys))
			r := Record{Key: []byte(k), Value: []byte(fmt.Sprint("v", i, "-", j))}
			if rng.Intn(20) == 0 {
				r.Value = nil
			}
			newest[k] = string(r.Value)
			rs = append(rs, r)
		}
		mustAppend(t, b, "c", 0, EncodeBatch(-1, -1, -1, rs))
	}
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	small := t.TempDir()
	if out, err := exec.Command("cp", "-a", dir+"/.", small).CombinedOutput(); err != nil {
		t.Fatalf("copy: %v: %s", err, out)
	}
	compacted := func(dir string, mapBytes int64) (map[int64]string, *logCapture) {
		logger, logs := captureLogs()
		b := openTest(t, dir, func(o *Options) { o.Now, o.Logger, o.CompactionMapBytes = clock.now, logger, mapBytes })
		if err := b.Compact(context.Background()); err != nil {
			t.Fatal(err)
		}
		got := map[int64]string{}
		seen := map[string]bool{}
		for _, r := range readAll(t, b, "c", 0) {
			v := "<nil>"
			if r.Value != nil {
				v = string(r.Value)
			}
			got[r.Offset] = string(r.Key) + "=" + v
			seen[string(r.Key)] = true
		}
		info, _ := b.Topic("c")
		if info.Partitions[0].Segments < 10 {
			t.Fatalf("only %d segments", info.Partitions[0].Segments)
		}
		return got, logs
	}
	one, oneLogs := compacted(dir, 0)
	passes, passLogs := compacted(small, 1) // the smallest map: 1,024 slots
	if len(oneLogs.lines(t, "compaction took several passes: the keys did not fit the key map (CompactionMapBytes)")) != 0 {
		t.Fatal("the default map needed several passes")
	}
	lines := passLogs.lines(t, "compaction took several passes: the keys did not fit the key map (CompactionMapBytes)")
	if len(lines) != 1 || lines[0]["passes"].(float64) < 3 {
		t.Fatalf("small map passes logged: %v", lines)
	}
	if fmt.Sprint(one) != fmt.Sprint(passes) {
		t.Fatalf("passes left %d records, one pass %d", len(passes), len(one))
	}
	// Every key's last record is its newest value (the active segment is
	// not compacted, so a key may have older ones there too), and the
	// compacted segments hold one record per key at most.
	last := map[string]int64{}
	for off, kv := range one {
		k, _, _ := strings.Cut(kv, "=")
		if o, ok := last[k]; !ok || off > o {
			last[k] = off
		}
	}
	for k, v := range newest {
		if v == "" {
			v = "<nil>"
		}
		if got := one[last[k]]; got != k+"="+v {
			t.Fatalf("key %s ends with %s, want %s", k, got, v)
		}
	}
	if len(one) > len(newest)+len(newest)/2 {
		t.Fatalf("%d records after compaction for %d keys", len(one), len(newest))
	}
}

package broker

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// The fuzz targets below feed arbitrary bytes to the parsers of the files
// a broker's open reads beside its segments: the clean-close manifest, a
// segment's recovery point and its producer state snapshot. Each is
// seeded with the files a real broker wrote.

// closedDir returns a data directory a broker wrote and closed cleanly,
// with an idempotent producer's batches in rolled segments, and its log id.
func closedDir(f *testing.F) (string, string) {
	dir := f.TempDir()
	// Small segments roll, and a roll writes a producer state snapshot.
	b := openWithTopic(f, dir, nil, "s", TopicConfig{Partitions: 2, SegmentBytes: 1024})
	for p := range int32(2) {
		for i := range int32(12) {
			mustAppend(f, b, "s", p, EncodeBatch(5, 0, 3*i, recs("a", 3)))
		}
	}
	if err := b.Close(); err != nil {
		f.Fatal(err)
	}
	var m metadata
	data, err := os.ReadFile(filepath.Join(dir, metaFile))
	if err == nil {
		err = json.Unmarshal(data, &m)
	}
	if err != nil {
		f.Fatal(err)
	}
	return dir, m.LogID
}

// seedFiles adds the files under dir whose names end in suffix as seeds.
func seedFiles(f *testing.F, dir, suffix string) {
	n := 0
	filepath.Walk(dir, func(path string, fi os.FileInfo, err error) error {
		if err == nil && !fi.IsDir() && strings.HasSuffix(path, suffix) {
			data, err := os.ReadFile(path)
			if err != nil {
				f.Fatal(err)
			}
			f.Add(data)
			n++
		}
		return nil
	})
	if n == 0 {
		f.Fatalf("a broker wrote no %s file", suffix)
	}
	f.Add([]byte{})
}

func FuzzParseCleanClose(f *testing.F) {
	dir, logID := closedDir(f)
	seedFiles(f, dir, cleanCloseFile)
	f.Fuzz(func(t *testing.T, data []byte) {
		m, err := parseCleanClose(data, logID)
		if err != nil {
			return
		}
		for k, e := range m {
			if len(e.bases) == 0 {
				t.Fatalf("%s/%d: an entry without segments was accepted", k.topic, k.id)
			}
		}
	})
}

// FuzzRecoveryFrames reads a recovery file's frames as loadRecoveryPoint
// does; the index entries it accepts only ever grow.
func FuzzRecoveryFrames(f *testing.F) {
	dir, _ := closedDir(f)
	b := openTest(f, dir, nil) // takes the manifest: the next close writes recovery points
	mustAppend(f, b, "s", 0, EncodeBatch(-1, -1, -1, recs("c", 2)))
	if err := b.Sync(); err != nil {
		f.Fatal(err)
	}
	seedFiles(f, dir, recoverySuffix)
	f.Fuzz(func(t *testing.T, data []byte) {
		var idx []offsetEntry
		var tidx []timeEntry
		for b := data; len(b) > 0; {
			fr, rest, ok := nextRecoveryFrame(b)
			if !ok {
				break
			}
			st, nidx, ntidx, ok := parseRecoveryFrame(fr, 0, idx, tidx)
			if !ok {
				break
			}
			if len(nidx) < len(idx) || len(ntidx) < len(tidx) || st.nIdx != len(nidx) || st.nTidx != len(ntidx) {
				t.Fatalf("index went from %d/%d to %d/%d entries (state %d/%d)", len(idx), len(tidx), len(nidx), len(ntidx), st.nIdx, st.nTidx)
			}
			idx, tidx, b = nidx, ntidx, rest
		}
	})
}

func FuzzDecodeSnapshot(f *testing.F) {
	dir, _ := closedDir(f)
	seedFiles(f, dir, snapshotSuffix)
	f.Fuzz(func(t *testing.T, data []byte) {
		_, _, _, _ = decodeSnapshot(data)
	})
}

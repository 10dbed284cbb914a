package broker

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"time"
)

// Inspection is what a data directory holds, read without opening the
// broker: topics with their settings and offsets, and committed group
// offsets with their lag.
type Inspection struct {
	Topics []TopicInfo
	Groups []GroupInspection
	// OffsetsUnread is how many bytes of groups/offsets.log follow its
	// last valid frame: a commit being written, or a torn or damaged tail
	// the broker's next open cuts aside.
	OffsetsUnread int
}

// GroupInspection is one group's committed offsets and lag per partition.
type GroupInspection struct {
	Group      string
	Partitions []InspectedOffset
}

// InspectedOffset is a committed offset against its partition's log.
type InspectedOffset struct {
	PartitionLag
	CommitTime time.Time
	Metadata   string
}

// Inspect reads the data directory dir like Dump does: it takes no lock and
// writes nothing, so it is safe while a broker has the directory open. The
// end offset of a partition is the end of its last complete batch on disk,
// which can be ahead of what a running broker has fsynced, and behind what
// it acknowledged by the batches it still holds in memory (about a second
// of them at most, writeback.go).
func Inspect(ctx context.Context, dir string) (Inspection, error) {
	var ins Inspection
	data, err := os.ReadFile(filepath.Join(dir, metaFile))
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return ins, fmt.Errorf("broker: %s holds no broker data (no %s)", dir, metaFile)
		}
		return ins, fmt.Errorf("broker: read %s: %w", metaFile, err)
	}
	var meta metadata
	if err := json.Unmarshal(data, &meta); err != nil {
		return ins, fmt.Errorf("broker: parse %s: %w", metaFile, err)
	}
	names := make([]string, 0, len(meta.Topics))
	for n := range meta.Topics {
		names = append(names, n)
	}
	sort.Strings(names)
	offsets := map[string][]PartitionInfo{}
	for _, n := range names {
		if err := ctx.Err(); err != nil {
			return ins, err
		}
		cfg := meta.Topics[n]
		// A broker only writes names and counts it validated: anything
		// else is not its metadata, and a name must not lead the reads
		// out of dir.
		if err := ValidateTopicName(n); err != nil {
			return ins, fmt.Errorf("broker: %s: %w", metaFile, err)
		}
		if cfg.Partitions < 0 || cfg.Partitions > maxPartitions {
			return ins, fmt.Errorf("broker: %s: topic %s has %d partitions", metaFile, n, cfg.Partitions)
		}
		ti := TopicInfo{Name: n, Config: cfg}
		for p := int32(0); p < cfg.Partitions; p++ {
			pi, err := inspectPartition(partitionDir(dir, n, p), p)
			if err != nil {
				return ins, fmt.Errorf("broker: inspect %s/%d: %w", n, p, err)
			}
			ti.Partitions = append(ti.Partitions, pi)
		}
		offsets[n] = ti.Partitions
		ins.Topics = append(ins.Topics, ti)
	}

	data, err = os.ReadFile(filepath.Join(dir, "groups", offsetsFile))
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return ins, fmt.Errorf("broker: read group offsets: %w", err)
	}
	// What follows the valid frames is a frame being written, or a torn
	// tail the next open cuts off. Membership frames (partition -1) and
	// deletions are applied as the open applies them: the groups shown
	// are the ones a broker opened on this directory would have.
	latest, _, valid := readOffsets(data)
	ins.OffsetsUnread = len(data) - valid
	byGroup := map[string]*GroupInspection{}
	for k, c := range latest {
		g := byGroup[k.group]
		if g == nil {
			g = &GroupInspection{Group: k.group}
			byGroup[k.group] = g
		}
		o := InspectedOffset{PartitionLag: PartitionLag{Topic: k.topic, Partition: k.partition, Committed: c.Offset},
			CommitTime: c.CommitTime, Metadata: c.Metadata}
		if parts := offsets[k.topic]; k.partition >= 0 && int(k.partition) < len(parts) {
			pi := parts[k.partition]
			o.LogStartOffset, o.HighWatermark = pi.LogStartOffset, pi.HighWatermark
			o.Lag = max(pi.HighWatermark-max(c.Offset, pi.LogStartOffset), 0)
			o.RetentionMargin = c.Offset - pi.LogStartOffset
			o.BelowLogStart = c.Offset < pi.LogStartOffset
		}
		g.Partitions = append(g.Partitions, o)
	}
	for _, g := range byGroup {
		sort.Slice(g.Partitions, func(i, j int) bool {
			a, b := g.Partitions[i], g.Partitions[j]
			if a.Topic != b.Topic {
				return a.Topic < b.Topic
			}
			return a.Partition < b.Partition
		})
		ins.Groups = append(ins.Groups, *g)
	}
	sort.Slice(ins.Groups, func(i, j int) bool { return ins.Groups[i].Group < ins.Groups[j].Group })
	return ins, nil
}

// inspectPartition sizes a partition's segments and finds its end offset by
// walking the batch headers of the last segment.
func inspectPartition(dir string, id int32) (PartitionInfo, error) {
	pi := PartitionInfo{Partition: id}
	bases, _, err := listSegmentBases(OSFS{}, dir, false)
	if errors.Is(err, os.ErrNotExist) {
		// Creating a topic creates its partition directories.
		pi.Lost = []LostRange{{First: 0, Last: -1, Segment: -1, Reason: "partition directory missing"}}
		return pi, nil
	}
	if err != nil {
		return pi, err
	}
	if pi.Lost, err = readLost(OSFS{}, dir); err != nil {
		return pi, err
	}
	if len(bases) == 0 {
		return pi, nil
	}
	pi.LogStartOffset, pi.Segments = bases[0], len(bases)
	for i, base := range bases {
		f, err := os.Open(segmentName(dir, base, logSuffix))
		if errors.Is(err, os.ErrNotExist) {
			continue // removed by retention while we listed
		}
		if err != nil {
			return pi, err
		}
		size, err := fileSize(f)
		if err != nil {
			f.Close()
			return pi, err
		}
		pi.Bytes += size
		if i == len(bases)-1 {
			end := base
			// A torn or in-progress tail stops the walk; what precedes it
			// is the log.
			_, _ = scanBatches(f, 0, size, false, func(h BatchHeader, _ int64, _ []byte) error {
				end = h.LastOffset() + 1
				return nil
			})
			pi.LogEndOffset, pi.HighWatermark = end, end
		}
		f.Close()
	}
	if floor, err := readLogStart(OSFS{}, dir); err == nil && floor > pi.LogStartOffset {
		pi.LogStartOffset = min(floor, pi.HighWatermark)
	}
	return pi, nil
}

// maxPartitions is the most partitions a topic may have (TopicConfig's
// validation, AddPartitions).
const maxPartitions = 100000

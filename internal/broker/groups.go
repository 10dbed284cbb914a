package broker

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"log/slog"
	"maps"
	"math"
	"path/filepath"
	"slices"
	"sort"
	"sync"
	"time"
)

// OffsetCommit is one committed position of a consumer group.
type OffsetCommit struct {
	Topic       string
	Partition   int32
	Offset      int64
	LeaderEpoch int32
	Metadata    string
}

// CommittedOffset is a stored commit.
type CommittedOffset struct {
	Offset      int64
	LeaderEpoch int32
	Metadata    string
	CommitTime  time.Time
}

type groupKey struct {
	group, topic string
	partition    int32
}

// groupStore keeps committed offsets in memory and in an append-only file of
// checksummed frames; the latest frame per key wins. The file is rewritten
// atomically once it is mostly superseded entries.
type groupStore struct {
	fs           FS
	dir          string
	compactBytes int64
	logger       *slog.Logger
	health       *health

	mu      sync.Mutex
	f       File
	size    int64
	offsets map[groupKey]CommittedOffset
	// memberships are the groups' saved membership states (see
	// SaveGroupMembership), in frames of their own key.
	memberships map[string]string
}

// membershipKey is the key of a group's membership frame: no topic is
// named "" and no partition is -1, so it never collides with an offset.
func membershipKey(group string) groupKey { return groupKey{group: group, partition: -1} }

func (k groupKey) isMembership() bool { return k.topic == "" && k.partition == -1 }

const offsetsFile = "offsets.log"

// deletedOffset in a frame deletes its key's committed offset (DeleteGroups,
// OffsetDelete).
const deletedOffset = math.MinInt64

// Frame: u32 payload length | u32 CRC32C(payload) | payload. Payload: u16
// group length, group, u16 topic length, topic, i32 partition, i64 offset,
// i32 leader epoch, i64 commit time (unix ms), u32 metadata length, metadata.
func appendOffsetFrame(dst []byte, k groupKey, c CommittedOffset) []byte {
	p := make([]byte, 0, 32+len(k.group)+len(k.topic)+len(c.Metadata))
	p = binary.BigEndian.AppendUint16(p, uint16(len(k.group)))
	p = append(p, k.group...)
	p = binary.BigEndian.AppendUint16(p, uint16(len(k.topic)))
	p = append(p, k.topic...)
	p = binary.BigEndian.AppendUint32(p, uint32(k.partition))
	p = binary.BigEndian.AppendUint64(p, uint64(c.Offset))
	p = binary.BigEndian.AppendUint32(p, uint32(c.LeaderEpoch))
	p = binary.BigEndian.AppendUint64(p, uint64(c.CommitTime.UnixMilli()))
	p = binary.BigEndian.AppendUint32(p, uint32(len(c.Metadata)))
	p = append(p, c.Metadata...)
	dst = binary.BigEndian.AppendUint32(dst, uint32(len(p)))
	dst = binary.BigEndian.AppendUint32(dst, crc32.Checksum(p, castagnoli))
	return append(dst, p...)
}

var errBadOffsetFrame = errors.New("broker: invalid offset commit frame")

func parseOffsetFrame(b []byte) (groupKey, CommittedOffset, int, error) {
	if len(b) < 8 {
		return groupKey{}, CommittedOffset{}, 0, errBadOffsetFrame
	}
	n := binary.BigEndian.Uint32(b)
	if uint64(n) > uint64(len(b)-8) || n < 2 {
		return groupKey{}, CommittedOffset{}, 0, errBadOffsetFrame
	}
	p := b[8 : 8+n]
	if crc32.Checksum(p, castagnoli) != binary.BigEndian.Uint32(b[4:]) {
		return groupKey{}, CommittedOffset{}, 0, errBadOffsetFrame
	}
	str16 := func() (string, bool) {
		if len(p) < 2 || int(binary.BigEndian.Uint16(p)) > len(p)-2 {
			return "", false
		}
		l := int(binary.BigEndian.Uint16(p))
		s := string(p[2 : 2+l])
		p = p[2+l:]
		return s, true
	}
	var k groupKey
	var c CommittedOffset
	var ok bool
	if k.group, ok = str16(); !ok {
		return k, c, 0, errBadOffsetFrame
	}
	if k.topic, ok = str16(); !ok || len(p) < 28 {
		return k, c, 0, errBadOffsetFrame
	}
	k.partition = int32(binary.BigEndian.Uint32(p))
	c.Offset = int64(binary.BigEndian.Uint64(p[4:]))
	c.LeaderEpoch = int32(binary.BigEndian.Uint32(p[12:]))
	c.CommitTime = time.UnixMilli(int64(binary.BigEndian.Uint64(p[16:])))
	ml := binary.BigEndian.Uint32(p[24:])
	if uint64(ml) != uint64(len(p)-28) {
		return k, c, 0, errBadOffsetFrame
	}
	c.Metadata = string(p[28:])
	return k, c, int(8 + n), nil
}

// applyOffsetFrame applies one parsed frame of the offsets file: a
// membership state, a committed offset, or the deletion of either. The
// open and Inspect both read the file through it, so that they agree on
// what it holds.
func applyOffsetFrame(offsets map[groupKey]CommittedOffset, memberships map[string]string, k groupKey, c CommittedOffset) {
	switch {
	case k.isMembership() && c.Offset == deletedOffset:
		delete(memberships, k.group)
	case k.isMembership():
		memberships[k.group] = c.Metadata
	case c.Offset == deletedOffset:
		delete(offsets, k)
	default:
		offsets[k] = c
	}
}

// readOffsets reads the frames of an offsets file's contents up to the
// first torn or damaged one and returns the committed offsets and
// membership states they leave, and how many bytes were valid.
func readOffsets(data []byte) (offsets map[groupKey]CommittedOffset, memberships map[string]string, valid int) {
	offsets, memberships = map[groupKey]CommittedOffset{}, map[string]string{}
	for valid < len(data) {
		k, c, n, err := parseOffsetFrame(data[valid:])
		if err != nil {
			break
		}
		applyOffsetFrame(offsets, memberships, k, c)
		valid += n
	}
	return offsets, memberships, valid
}

func openGroupStore(fsys FS, dir string, compactBytes int64, logger *slog.Logger, h *health) (*groupStore, error) {
	if err := fsys.MkdirAll(dir, 0o755); err != nil {
		return nil, storageErr("create groups dir", err)
	}
	g := &groupStore{fs: fsys, dir: dir, compactBytes: compactBytes, logger: logger, health: h,
		offsets: map[groupKey]CommittedOffset{}, memberships: map[string]string{}}
	f, size, err := loadFrameLog(fsys, filepath.Join(dir, offsetsFile), logger, "offsets", func(b []byte) (int, error) {
		k, c, n, err := parseOffsetFrame(b)
		if err != nil {
			return 0, err
		}
		applyOffsetFrame(g.offsets, g.memberships, k, c)
		return n, nil
	})
	if err != nil {
		return nil, err
	}
	g.f, g.size = f, size
	return g, nil
}

func (g *groupStore) commit(group string, commits []OffsetCommit, now time.Time) error {
	var buf []byte
	for _, c := range commits {
		buf = appendOffsetFrame(buf, groupKey{group, c.Topic, c.Partition},
			CommittedOffset{Offset: c.Offset, LeaderEpoch: c.LeaderEpoch, Metadata: c.Metadata, CommitTime: now})
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if err := g.writeLocked(buf); err != nil {
		return err
	}
	for _, c := range commits {
		g.offsets[groupKey{group, c.Topic, c.Partition}] = CommittedOffset{Offset: c.Offset, LeaderEpoch: c.LeaderEpoch, Metadata: c.Metadata, CommitTime: now}
	}
	if g.size > g.compactBytes {
		if err := g.compactLocked(); err != nil {
			g.logger.Warn("offsets compaction failed", "err", err)
		}
	}
	return nil
}

// remove durably deletes the committed offsets of keys (and memberships
// of membership keys): one frame each with deletedOffset, one fsync.
func (g *groupStore) remove(keys []groupKey, now time.Time) error {
	var buf []byte
	for _, k := range keys {
		buf = appendOffsetFrame(buf, k, CommittedOffset{Offset: deletedOffset, CommitTime: now})
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if err := g.writeLocked(buf); err != nil {
		return err
	}
	for _, k := range keys {
		if k.isMembership() {
			delete(g.memberships, k.group)
		} else {
			delete(g.offsets, k)
		}
	}
	return nil
}

// saveMembership durably replaces a group's membership state (one fsync).
func (g *groupStore) saveMembership(group, state string, now time.Time) error {
	buf := appendOffsetFrame(nil, membershipKey(group), CommittedOffset{CommitTime: now, Metadata: state})
	g.mu.Lock()
	defer g.mu.Unlock()
	if err := g.writeLocked(buf); err != nil {
		return err
	}
	g.memberships[group] = state
	return nil
}

// writeLocked appends frames and fsyncs them; a failed write is cut off
// again.
func (g *groupStore) writeLocked(buf []byte) error {
	if err := appendFrames(g.f, g.size, g.health, buf, "offsets"); err != nil {
		return err
	}
	g.size += int64(len(buf))
	return nil
}

// compactLocked rewrites the file with only the live entries when at least
// half of it is superseded.
func (g *groupStore) compactLocked() error {
	keys := make([]groupKey, 0, len(g.offsets))
	for k := range g.offsets {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool {
		a, b := keys[i], keys[j]
		if a.group != b.group {
			return a.group < b.group
		}
		if a.topic != b.topic {
			return a.topic < b.topic
		}
		return a.partition < b.partition
	})
	var buf []byte
	for _, k := range keys {
		buf = appendOffsetFrame(buf, k, g.offsets[k])
	}
	groups := slices.Sorted(maps.Keys(g.memberships))
	for _, id := range groups {
		buf = appendOffsetFrame(buf, membershipKey(id), CommittedOffset{Metadata: g.memberships[id]})
	}
	if int64(len(buf))*2 > g.size {
		return nil
	}
	return replaceFrameLog(g.fs, filepath.Join(g.dir, offsetsFile), &g.f, &g.size, buf)
}

func (g *groupStore) close() error {
	g.mu.Lock()
	defer g.mu.Unlock()
	return closeFrameLog(&g.f)
}

// CommitOffsets durably stores a group's committed offsets (one fsync per
// call). Unknown topics or partitions are refused, as Kafka does.
func (b *Broker) CommitOffsets(ctx context.Context, group string, commits []OffsetCommit) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if group == "" || len(group) > 1<<15 {
		return fmt.Errorf("%w: group id length %d", ErrInvalidConfig, len(group))
	}
	for _, c := range commits {
		if _, _, err := b.lookup(c.Topic, c.Partition, false); err != nil {
			return err
		}
	}
	return b.groupStore().commit(group, commits, b.opts.Now())
}

// FetchOffset returns a group's committed offset for a partition; ok is
// false when the group never committed one.
func (b *Broker) FetchOffset(group, topicName string, part int32) (c CommittedOffset, ok bool) {
	g := b.groupStore()
	g.mu.Lock()
	defer g.mu.Unlock()
	c, ok = g.offsets[groupKey{group, topicName, part}]
	return c, ok
}

// GroupOffset is one committed offset of a group.
type GroupOffset struct {
	Topic     string
	Partition int32
	CommittedOffset
}

// GroupOffsets lists a group's committed offsets sorted by topic and
// partition.
func (b *Broker) GroupOffsets(group string) []GroupOffset {
	g := b.groupStore()
	g.mu.Lock()
	var out []GroupOffset
	for k, c := range g.offsets {
		if k.group == group {
			out = append(out, GroupOffset{Topic: k.topic, Partition: k.partition, CommittedOffset: c})
		}
	}
	g.mu.Unlock()
	sort.Slice(out, func(i, j int) bool {
		if out[i].Topic != out[j].Topic {
			return out[i].Topic < out[j].Topic
		}
		return out[i].Partition < out[j].Partition
	})
	return out
}

// DeleteOffsets durably deletes a group's committed offsets of the given
// partitions, or all of them and its saved membership when parts is nil,
// and returns how many offsets it deleted.
func (b *Broker) DeleteOffsets(group string, parts []TopicPartition) (int, error) {
	gs := b.groupStore()
	if gs == nil {
		return 0, ErrClosed
	}
	gs.mu.Lock()
	var keys []groupKey
	if parts == nil {
		for k := range gs.offsets {
			if k.group == group {
				keys = append(keys, k)
			}
		}
	} else {
		for _, tp := range parts {
			k := groupKey{group, tp.Topic, tp.Partition}
			if _, ok := gs.offsets[k]; ok {
				keys = append(keys, k)
			}
		}
	}
	n := len(keys)
	if _, ok := gs.memberships[group]; ok && parts == nil {
		// The whole group goes: its membership state with it.
		keys = append(keys, membershipKey(group))
	}
	gs.mu.Unlock()
	if len(keys) == 0 {
		return 0, nil
	}
	return n, gs.remove(keys, b.opts.Now())
}

// TopicPartition names one partition.
type TopicPartition struct {
	Topic     string
	Partition int32
}

// Groups lists groups with committed offsets.
func (b *Broker) Groups() []string {
	g := b.groupStore()
	g.mu.Lock()
	seen := map[string]bool{}
	for k := range g.offsets {
		seen[k.group] = true
	}
	g.mu.Unlock()
	out := make([]string, 0, len(seen))
	for g := range seen {
		out = append(out, g)
	}
	sort.Strings(out)
	return out
}

// PartitionLag is a group's position against one partition's log.
type PartitionLag struct {
	Topic          string
	Partition      int32
	Committed      int64
	LogStartOffset int64
	HighWatermark  int64
	// Lag is how many records the group has yet to consume.
	Lag int64
	// RetentionMargin is how far the committed offset is above the log
	// start: the records retention may still delete before the group loses
	// data. Zero or negative is the alert condition.
	RetentionMargin int64
	// BelowLogStart means retention already deleted records the group had
	// not consumed; the group will reset per its offset reset policy.
	BelowLogStart bool
}

// GroupLag reports lag and retention margin for every partition the group
// committed on.
func (b *Broker) GroupLag(group string) ([]PartitionLag, error) {
	offs := b.GroupOffsets(group)
	if len(offs) == 0 {
		return nil, fmt.Errorf("%w: %s", ErrUnknownGroup, group)
	}
	out := make([]PartitionLag, 0, len(offs))
	for _, o := range offs {
		start, hw, err := b.Offsets(o.Topic, o.Partition)
		if err != nil {
			continue
		}
		pl := PartitionLag{Topic: o.Topic, Partition: o.Partition, Committed: o.Offset, LogStartOffset: start, HighWatermark: hw}
		pl.Lag = max(hw-max(o.Offset, start), 0)
		pl.RetentionMargin = o.Offset - start
		pl.BelowLogStart = o.Offset < start
		out = append(out, pl)
	}
	return out, nil
}

// groupStore returns the group offsets of the current open.
func (b *Broker) groupStore() *groupStore {
	b.mu.RLock()
	defer b.mu.RUnlock()
	return b.groups
}

// SaveGroupMembership durably stores a group's membership state, an opaque
// value of the Kafka listener's group coordinator (its members, generation
// and assignments), kept in the offsets file beside the group's commits so
// that a restart or a takeover finds the group as it was. An empty state
// deletes it.
func (b *Broker) SaveGroupMembership(group string, state []byte) error {
	gs := b.groupStore()
	if gs == nil {
		return ErrClosed
	}
	if len(state) == 0 {
		return gs.remove([]groupKey{membershipKey(group)}, b.opts.Now())
	}
	return gs.saveMembership(group, string(state), b.opts.Now())
}

// GroupMemberships returns every saved membership state by group.
func (b *Broker) GroupMemberships() map[string][]byte {
	gs := b.groupStore()
	if gs == nil {
		return nil
	}
	gs.mu.Lock()
	defer gs.mu.Unlock()
	out := make(map[string][]byte, len(gs.memberships))
	for id, st := range gs.memberships {
		out[id] = []byte(st)
	}
	return out
}

// GroupMembership returns one group's saved membership state.
func (b *Broker) GroupMembership(group string) ([]byte, bool) {
	gs := b.groupStore()
	if gs == nil {
		return nil, false
	}
	gs.mu.Lock()
	defer gs.mu.Unlock()
	st, ok := gs.memberships[group]
	return []byte(st), ok
}

package broker

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"time"
)

// LostRange is a run of offsets a partition held, or may have held, and can
// no longer serve: a batch whose CRC fails and that no journal copy could
// repair, offsets missing from both the segment and the journal, or a whole
// partition directory that vanished. Fetches inside it fail with
// ErrDataLost instead of skipping it.
type LostRange struct {
	// First and Last are the offsets lost, inclusive. Last is -1 when the
	// extent is unknown (a vanished partition directory).
	First int64 `json:"first"`
	Last  int64 `json:"last"`
	// Reason says how the loss was found.
	Reason   string    `json:"reason"`
	Detected time.Time `json:"detected"`
	// Segment is the base offset of the segment that keeps the damaged
	// bytes in place at [Pos, Pos+Size), or -1 when none does.
	Segment int64 `json:"segment"`
	Pos     int64 `json:"pos"`
	Size    int64 `json:"size"`
}

// Records is the number of offsets lost (0 when unknown).
func (r LostRange) Records() int64 {
	if r.Last < r.First {
		return 0
	}
	return r.Last - r.First + 1
}

func (r LostRange) contains(offset int64) bool {
	return r.Last >= r.First && offset >= r.First && offset <= r.Last
}

// span is a run of damaged bytes inside a segment file.
type span struct {
	pos, size int64
}

// skipAt returns the size of the damaged span starting at pos (0: none).
func skipAt(skip []span, pos int64) int64 {
	for _, s := range skip {
		if s.pos == pos {
			return s.size
		}
	}
	return 0
}

const lostFile = "lost.json"

type lostDoc struct {
	Version int         `json:"version"`
	Lost    []LostRange `json:"lost"`
}

// readLost reads a partition's lost.json; no file means nothing lost.
func readLost(fsys FS, dir string) ([]LostRange, error) {
	data, err := readFile(fsys, filepath.Join(dir, lostFile))
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, storageErr("read "+lostFile, err)
	}
	var doc lostDoc
	if err := json.Unmarshal(data, &doc); err != nil {
		return nil, fmt.Errorf("broker: parse %s: %w", filepath.Join(dir, lostFile), err)
	}
	return doc.Lost, nil
}

// loadLostLocked reads lost.json and hands each segment its damaged spans.
func (p *partition) loadLostLocked() error {
	lost, err := readLost(p.set.fs, p.dir)
	if err != nil {
		return err
	}
	p.lost = lost
	p.attachDamageLocked()
	return nil
}

// attachDamageLocked rebuilds every segment's damaged spans from p.lost.
func (p *partition) attachDamageLocked() {
	for _, s := range p.segs {
		s.damaged = nil
		for _, r := range p.lost {
			if r.Segment == s.base && r.Size > 0 {
				s.damaged = append(s.damaged, span{pos: r.Pos, size: r.Size})
			}
		}
		sort.Slice(s.damaged, func(i, j int) bool { return s.damaged[i].pos < s.damaged[j].pos })
	}
}

// recordLostLocked reports a loss: an ERROR log naming the offsets, the
// partition's Lost list and its lost.json. A range already known (same
// damaged bytes, or offsets it covers) is not reported twice. It returns
// the range as recorded.
func (p *partition) recordLostLocked(r LostRange) LostRange {
	for _, have := range p.lost {
		if (r.Segment >= 0 && have.Segment == r.Segment && have.Pos == r.Pos && have.Size > 0) ||
			(have.First <= r.First && have.Last >= r.Last && r.Last >= r.First) {
			return have
		}
	}
	if r.Detected.IsZero() {
		r.Detected = p.set.now()
	}
	p.lost = append(p.lost, r)
	sort.Slice(p.lost, func(i, j int) bool { return p.lost[i].First < p.lost[j].First })
	p.attachDamageLocked()
	p.set.logger.Error("data lost", "topic", p.topic, "partition", p.id, "first_offset", r.First, "last_offset", r.Last,
		"records", r.Records(), "reason", r.Reason, "segment", r.Segment, "pos", r.Pos, "bytes", r.Size)
	if err := p.saveLostLocked(); err != nil {
		p.set.logger.Error("recording lost data failed", "topic", p.topic, "partition", p.id, "err", err)
	}
	return r
}

func (p *partition) saveLostLocked() error {
	data, err := json.MarshalIndent(lostDoc{Version: 1, Lost: p.lost}, "", "  ")
	if err != nil {
		return fmt.Errorf("broker: encode %s: %w", lostFile, err)
	}
	return storageErr("write "+lostFile, writeFileAtomic(p.set.fs, filepath.Join(p.dir, lostFile), data))
}

// lostAtLocked returns the lost range holding offset, if any.
func (p *partition) lostAtLocked(offset int64) (LostRange, bool) {
	for _, r := range p.lost {
		if r.contains(offset) {
			return r, true
		}
	}
	return LostRange{}, false
}

func (p *partition) lostErr(r LostRange) error {
	return &lostError{topic: p.topic, partition: p.id, first: r.First, last: r.Last, reason: r.Reason}
}

// segmentEndLocked is the offset just past what segment i may hold: the
// next segment's base, or the log end for the active one.
func (p *partition) segmentEndLocked(i int) int64 {
	if i+1 < len(p.segs) {
		return p.segs[i+1].base
	}
	return p.next
}

// locateDamage measures a damaged batch at pos in f, whose first offset
// is at least first, in a segment whose valid bytes end at limit and whose
// offsets end before end. When its length field is sound and a good batch
// follows (or the segment ends right after it), only that batch is lost, up
// to the next batch's base; damaged batches in a row, each length field
// sound, are lost together up to the good batch after them (at most
// maxDamagedRun of them). Otherwise everything from pos to limit is.
func locateDamage(f File, pos, limit, first, end int64) (size, last int64) {
	var hdr [BatchHeaderSize]byte
	at := pos
	for hop := 0; hop < maxDamagedRun && limit-at >= BatchHeaderSize; hop++ {
		if _, err := f.ReadAt(hdr[:], at); err != nil {
			break
		}
		h, err := ParseBatchHeader(hdr[:])
		if err != nil || int64(h.Size()) > limit-at {
			break
		}
		next := at + int64(h.Size())
		if next == limit {
			last = end - 1
			if h.LastOffset() >= first && h.LastOffset() < end {
				last = h.LastOffset()
			}
			return next - pos, last
		}
		if nh, ok := goodBatchAt(f, next, limit); ok && nh.BaseOffset >= first && nh.BaseOffset <= end {
			return next - pos, nh.BaseOffset - 1
		}
		at = next
	}
	return limit - pos, end - 1
}

// maxDamagedRun bounds the damaged batches locateDamage walks over.
const maxDamagedRun = 64

// goodBatchAt reports whether a whole batch with a valid CRC starts at pos.
func goodBatchAt(f File, pos, limit int64) (BatchHeader, bool) {
	var hdr [BatchHeaderSize]byte
	if limit-pos < BatchHeaderSize {
		return BatchHeader{}, false
	}
	if _, err := f.ReadAt(hdr[:], pos); err != nil {
		return BatchHeader{}, false
	}
	h, err := ParseBatchHeader(hdr[:])
	if err != nil || int64(h.Size()) > limit-pos {
		return BatchHeader{}, false
	}
	b := make([]byte, h.Size())
	if _, err := f.ReadAt(b, pos); err != nil {
		return BatchHeader{}, false
	}
	if _, err := VerifyBatch(b); err != nil {
		return BatchHeader{}, false
	}
	return h, true
}

// Lost returns the offset ranges of a partition known to be lost.
func (b *Broker) Lost(topicName string, part int32) ([]LostRange, error) {
	_, p, err := b.lookup(topicName, part, false)
	if err != nil {
		return nil, err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]LostRange(nil), p.lost...), nil
}

package protocol

import (
	"encoding/binary"
	"slices"
	"time"
)

// sharePartition is a share group's view of one partition: the share-
// partition start offset (SPSO, start) and end offset (SPEO, end), and the
// in-flight records between them. Every offset below start is done
// (acknowledged, archived, or never a record); an offset in [start, end)
// is in flight when recs holds it (acquired by a member, or available
// again after a release or lock timeout), and done otherwise; every offset
// from end on is available for a first delivery. Accepting, rejecting or
// archiving a record deletes it from recs, and start moves up to the
// lowest record still in flight, so the state is bounded by the records in
// flight, not by the log.
type sharePartition struct {
	start, end int64
	recs       map[int64]*shareRec
	// dead are records archived by rejection or the delivery limit, for
	// the dead-letter topic (share_dlq.go).
	dead []deadRec
}

// shareRec is one in-flight record.
type shareRec struct {
	count    int16 // deliveries so far
	owner    string
	deadline time.Time // of the acquisition lock; zero when available
}

// Acknowledge types of ShareFetch and ShareAcknowledge.
const (
	ackGap     = 0
	ackAccept  = 1
	ackRelease = 2
	ackReject  = 3
	ackRenew   = 4
)

// settle moves start up to the lowest in-flight record (or end).
func (sp *sharePartition) settle() {
	for sp.start < sp.end {
		if _, ok := sp.recs[sp.start]; ok {
			return
		}
		sp.start++
		if len(sp.recs) == 0 {
			sp.start = sp.end
		}
	}
}

// clamp drops what the log no longer has: offsets below logStart.
func (sp *sharePartition) clamp(logStart int64) {
	if sp.start >= logStart {
		return
	}
	for o := range sp.recs {
		if o < logStart {
			delete(sp.recs, o)
		}
	}
	sp.start = logStart
	sp.end = max(sp.end, logStart)
	sp.settle()
}

// expire ends the locks that passed their deadline: each record becomes
// available again, or is archived at the delivery limit. It reports
// whether anything changed.
func (sp *sharePartition) expire(now time.Time, limit int) bool {
	changed := false
	for o, r := range sp.recs {
		if r.owner != "" && !r.deadline.After(now) {
			sp.makeAvailable(o, r, limit)
			changed = true
		}
	}
	if changed {
		sp.settle()
	}
	return changed
}

// makeAvailable ends r's acquisition: available again, or archived once
// it was delivered limit times.
func (sp *sharePartition) makeAvailable(o int64, r *shareRec, limit int) {
	if int(r.count) >= limit {
		delete(sp.recs, o)
		sp.dead = append(sp.dead, deadRec{offset: o, count: r.count, reason: deadDeliveryLimit})
		return
	}
	r.owner, r.deadline = "", time.Time{}
}

// nextDeadline is the earliest lock deadline, zero if none.
func (sp *sharePartition) nextDeadline() time.Time {
	var d time.Time
	for _, r := range sp.recs {
		if r.owner != "" && (d.IsZero() || r.deadline.Before(d)) {
			d = r.deadline
		}
	}
	return d
}

// firstAvailable is the lowest offset in [start, end) available again,
// or end.
func (sp *sharePartition) firstAvailable() int64 {
	first := sp.end
	for o, r := range sp.recs {
		if r.owner == "" && o < first {
			first = o
		}
	}
	return first
}

// locked counts the acquired records.
func (sp *sharePartition) locked() int {
	n := 0
	for _, r := range sp.recs {
		if r.owner != "" {
			n++
		}
	}
	return n
}

// acquisition is records one share fetch acquired in a partition: the
// record batches holding them, and the acquired offsets with their
// delivery counts, ascending.
type acquisition struct {
	batches []byte
	offsets []int64
	counts  []int16
}

// acquire walks the record batches in data (read from the log) and
// acquires for member, up to maxRecords, every record that is available:
// in flight and released, or at or past end. A control batch's offsets
// past end are done at once. Batches holding an acquired record, not
// already in seen (by base offset), are kept in acq.
func (sp *sharePartition) acquire(data []byte, member string, maxRecords int, deadline time.Time, seen map[int64]bool, acq *acquisition) {
	for len(data) >= 61 && len(acq.offsets) < maxRecords {
		base := int64(binary.BigEndian.Uint64(data[0:8]))
		size := 12 + int(int32(binary.BigEndian.Uint32(data[8:12])))
		if size < 61 || size > len(data) {
			return
		}
		batch := data[:size]
		data = data[size:]
		attrs := binary.BigEndian.Uint16(batch[21:23])
		last := base + int64(int32(binary.BigEndian.Uint32(batch[23:27])))
		if attrs&0x20 != 0 { // control batch
			if last >= sp.end {
				sp.end = last + 1
				sp.settle()
			}
			continue
		}
		took := false
		for o := max(base, sp.start); o <= last && len(acq.offsets) < maxRecords; o++ {
			r := sp.recs[o]
			switch {
			case o >= sp.end:
				r = &shareRec{}
				sp.recs[o] = r
				sp.end = o + 1
			case r == nil || r.owner != "":
				continue
			}
			r.count++
			r.owner, r.deadline = member, deadline
			acq.offsets = append(acq.offsets, o)
			acq.counts = append(acq.counts, r.count)
			took = true
		}
		if took && !seen[base] {
			seen[base] = true
			acq.batches = append(acq.batches, batch...)
		}
	}
}

// ackBatch is one acknowledgement range: types holds one type for the
// whole range or one per offset.
type ackBatch struct {
	first, last int64
	types       []int8
}

// validate reports whether every offset of the batches that is not a gap
// is a record member holds; nothing changes.
func (sp *sharePartition) validate(member string, batches []ackBatch) bool {
	for _, b := range batches {
		if b.last < b.first || len(b.types) == 0 || (len(b.types) != 1 && int64(len(b.types)) != b.last-b.first+1) {
			return false
		}
		for o := b.first; o <= b.last; o++ {
			t := b.types[0]
			if len(b.types) > 1 {
				t = b.types[o-b.first]
			}
			if t < ackGap || t > ackRenew {
				return false
			}
			if t == ackGap {
				continue
			}
			if r := sp.recs[o]; r == nil || r.owner != member {
				return false
			}
		}
	}
	return true
}

// apply applies validated acknowledgements; renew extends a lock to
// deadline. It reports whether a record became available again.
func (sp *sharePartition) apply(member string, batches []ackBatch, limit int, deadline time.Time) (released bool) {
	for _, b := range batches {
		for o := b.first; o <= b.last; o++ {
			t := b.types[0]
			if len(b.types) > 1 {
				t = b.types[o-b.first]
			}
			r := sp.recs[o]
			if r == nil || (r.owner != member && t != ackGap) {
				continue
			}
			switch t {
			case ackGap:
				if r.owner == member {
					delete(sp.recs, o)
				}
			case ackAccept:
				delete(sp.recs, o)
			case ackReject:
				delete(sp.recs, o)
				sp.dead = append(sp.dead, deadRec{offset: o, count: r.count, reason: deadRejected})
			case ackRelease:
				sp.makeAvailable(o, r, limit)
				released = true
			case ackRenew:
				r.deadline = deadline
			}
		}
	}
	sp.settle()
	return released
}

// releaseMember makes every record member holds available again (or
// archives it at the delivery limit); it reports whether any was held.
func (sp *sharePartition) releaseMember(member string, limit int) bool {
	any := false
	for o, r := range sp.recs {
		if r.owner == member {
			sp.makeAvailable(o, r, limit)
			any = true
		}
	}
	if any {
		sp.settle()
	}
	return any
}

// releaseMember releases member's records in every partition of g and
// wakes waiting fetches; it reports whether any was held. g.mu held.
func (g *shareGroup) releaseMember(member string, now time.Time) bool {
	any := false
	for _, sp := range g.parts {
		if sp.releaseMember(member, g.cfg.limit()) {
			any = true
		}
	}
	if any {
		g.signal()
	}
	return any
}

// inFlight lists the in-flight offsets ascending (for tests and status).
func (sp *sharePartition) inFlight() []int64 {
	out := make([]int64, 0, len(sp.recs))
	for o := range sp.recs {
		out = append(out, o)
	}
	slices.Sort(out)
	return out
}

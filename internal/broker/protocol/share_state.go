package protocol

import (
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/outboxrelay/relay/internal/broker"
)

// Durable share state. Each share group's configs and share partitions
// are one file, share-groups/<hex of the group id>.json in the broker's
// data directory, replaced atomically (broker.WriteFileAtomic: write,
// fsync, rename, fsync the directory) before the acknowledgement that
// changed it is answered. A share partition is saved as its start and end
// offsets and its in-flight records with their delivery counts; an
// acquired record is saved as available, so after a restart it is
// delivered again (with its count) rather than lost, or archived (and
// copied to the dead-letter topic) at restore if that count reached
// share.delivery.count.limit, so no record is delivered past the limit;
// a record whose acceptance was answered is never delivered again. The file holds only
// records in flight, so it does not grow with the log.
//
// Acquisitions alone do not write the file (a fetch would otherwise cost
// an fsync): after a crash, records acquired since the last write come
// back with the delivery count of that write, and records past its end
// offset as new. Fault model: a crash or kill at any point leaves the old
// or the new file (WriteFileAtomic), so the state after restart is that
// of some acknowledgement already answered or a later one; a failed write
// is logged and the acknowledgement still answered, the change then
// lasting until the next write or restart
// (TestShareStateSurvivesRestart shows the restart case).

const shareStateDir = "share-groups"

type savedShareGroup struct {
	ID    string            `json:"id"`
	Cfg   shareConfig       `json:"cfg"`
	Parts []savedSharePartn `json:"parts,omitempty"`
}

type savedSharePartn struct {
	Topic     string     `json:"topic"`
	Partition int32      `json:"partition"`
	Start     int64      `json:"start"`
	End       int64      `json:"end"`
	Recs      [][2]int64 `json:"recs,omitempty"` // offset, delivery count
}

func (sc *shareCoordinator) statePath(id string) string {
	return filepath.Join(sc.s.b.Dir(), shareStateDir, hex.EncodeToString([]byte(id))+".json")
}

// persist copies newly archived records to the dead-letter topic, then
// saves g. g.mu held.
func (sc *shareCoordinator) persist(g *shareGroup) {
	sc.writeDeadLetters(g)
	sg := savedShareGroup{ID: g.id, Cfg: g.cfg}
	for tp, sp := range g.parts {
		p := savedSharePartn{Topic: tp.topic, Partition: tp.partition, Start: sp.start, End: sp.end}
		for _, o := range sp.inFlight() {
			p.Recs = append(p.Recs, [2]int64{o, int64(sp.recs[o].count)})
		}
		sg.Parts = append(sg.Parts, p)
	}
	slices.SortFunc(sg.Parts, func(a, b savedSharePartn) int {
		if c := strings.Compare(a.Topic, b.Topic); c != 0 {
			return c
		}
		return int(a.Partition - b.Partition)
	})
	data, err := json.Marshal(sg)
	if err == nil {
		if err = os.MkdirAll(filepath.Join(sc.s.b.Dir(), shareStateDir), 0o755); err == nil {
			err = broker.WriteFileAtomic(broker.OSFS{}, sc.statePath(g.id), data, 0o644)
		}
	}
	if err != nil {
		sc.s.log.Error("saving share group state failed", "group", g.id, "err", err)
	}
}

// restore loads the saved share groups.
func (sc *shareCoordinator) restore() {
	dir := filepath.Join(sc.s.b.Dir(), shareStateDir)
	entries, err := os.ReadDir(dir)
	if err != nil {
		if !errors.Is(err, fs.ErrNotExist) {
			sc.s.log.Error("reading saved share groups failed", "err", err)
		}
		return
	}
	for _, e := range entries {
		if !strings.HasSuffix(e.Name(), ".json") {
			continue
		}
		data, err := os.ReadFile(filepath.Join(dir, e.Name()))
		var sg savedShareGroup
		if err == nil {
			err = json.Unmarshal(data, &sg)
		}
		if err != nil {
			sc.s.log.Error("a saved share group is unreadable; skipping it", "file", e.Name(), "err", err)
			continue
		}
		g := newShareGroup(sg.ID)
		g.cfg = sg.Cfg
		archived := false
		for _, p := range sg.Parts {
			sp := &sharePartition{start: p.Start, end: p.End, recs: map[int64]*shareRec{}}
			for _, r := range p.Recs {
				rec := &shareRec{count: int16(r[1])}
				sp.recs[r[0]] = rec
				// A record saved while acquired for its last delivery
				// had that acquisition ended by the restart: archived,
				// as its lock running out would have.
				if int(rec.count) >= g.cfg.limit() {
					sp.makeAvailable(r[0], rec, g.cfg.limit())
					archived = true
				}
			}
			sp.settle()
			g.parts[topicPart{topic: p.Topic, partition: p.Partition}] = sp
		}
		if archived {
			g.mu.Lock()
			sc.persist(g)
			g.mu.Unlock()
		}
		sc.groups[sg.ID] = g
	}
}

// deleteState removes a share group's saved state.
func (sc *shareCoordinator) deleteState(id string) error {
	err := os.Remove(sc.statePath(id))
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	return err
}

// ShareGroupState is a share group's saved state, as `relay groups` shows
// it.
type ShareGroupState struct {
	Group      string
	Partitions []SharePartitionState
}

// SharePartitionState is one saved share partition: its start and end
// offsets and the records in flight between them (acquired or to be
// delivered again).
type SharePartitionState struct {
	Topic      string
	Partition  int32
	Start, End int64
	InFlight   int
}

// SavedShareGroups reads the share groups saved in the broker data
// directory dir, sorted by id. It only reads, so it is safe while a relay
// runs; a file that does not parse is an error naming it.
func SavedShareGroups(dir string) ([]ShareGroupState, error) {
	entries, err := os.ReadDir(filepath.Join(dir, shareStateDir))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var out []ShareGroupState
	for _, e := range entries {
		if !strings.HasSuffix(e.Name(), ".json") {
			continue
		}
		path := filepath.Join(dir, shareStateDir, e.Name())
		data, err := os.ReadFile(path)
		if err != nil {
			return nil, err
		}
		var sg savedShareGroup
		if err := json.Unmarshal(data, &sg); err != nil {
			return nil, fmt.Errorf("share group state %s: %w", path, err)
		}
		st := ShareGroupState{Group: sg.ID}
		for _, p := range sg.Parts {
			st.Partitions = append(st.Partitions, SharePartitionState{Topic: p.Topic, Partition: p.Partition, Start: p.Start, End: p.End, InFlight: len(p.Recs)})
		}
		out = append(out, st)
	}
	slices.SortFunc(out, func(a, b ShareGroupState) int { return strings.Compare(a.Group, b.Group) })
	return out, nil
}

package embedded

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"syscall"
	"time"

	"github.com/outboxrelay/relay/internal/broker"
	"github.com/outboxrelay/relay/relay"
)

// legacyIdentityFile held the producer id of earlier versions, which kept
// it outside the broker; its id is the saved state's, so it is only
// removed.
const legacyIdentityFile = "relay-producer.json"

// Start opens the broker, unless it is still open from an earlier session
// (waiting while another process holds the directory), takes a new epoch
// of the relay's producer and reads the identities of the unacknowledged
// tail (steps 1 and 3 of the package doc).
func (s *Sink) Start(ctx context.Context, session relay.Session) error {
	s.Close(ctx)
	s.stopLinger()
	if err := os.MkdirAll(s.cfg.Broker.Dir, 0o755); err != nil {
		return fmt.Errorf("embedded sink: %w", err)
	}
	var saved state
	if session.State != nil {
		if err := json.Unmarshal(session.State, &saved); err != nil {
			return fmt.Errorf("embedded sink: reading the saved state: %w", err)
		}
	}
	s.mu.Lock()
	b, reopen := s.b, s.reopen
	s.reopen = false
	s.mu.Unlock()
	if b != nil && !reopen && b.Health() == nil {
		// The previous session's last batches may be written but not
		// fsynced (their waits abandoned with the session), so beyond the
		// high watermark that step 3 reads up to: make them durable, and
		// visible to it, first. Reopening did that implicitly.
		if err := b.Sync(); err != nil {
			if b.Health() == nil {
				// A write failed (a full disk) and no fsync did: the
				// bytes are still in memory and the broker is sound.
				// Reopening would close the Kafka listener and, with the
				// disk full, could not open it again; the session waits
				// for the disk instead.
				s.startLinger()
				return fmt.Errorf("embedded sink: making the previous session's appends durable: %w", err)
			}
			s.cfg.Logger.Warn("making the previous session's appends durable failed; reopening the broker", "err", err)
			reopen = true
		}
	}
	if b != nil && (reopen || b.Health() != nil) {
		// A failed fsync is cleared only by reading the log from disk
		// again, and a deleted topic's name is free again only once the
		// broker reopened: as before a restart, it is opened anew.
		s.closeBroker()
		b = nil
	}
	if b == nil {
		var err error
		if b, err = s.open(ctx); err != nil {
			return err
		}
		var stop func()
		if s.cfg.OnOpen != nil {
			if stop, err = s.cfg.OnOpen(b); err != nil {
				b.Close()
				return fmt.Errorf("embedded sink: %w", err)
			}
		}
		s.mu.Lock()
		s.b, s.stopFn = b, stop
		s.mu.Unlock()
	}
	// The core starts a session only as the leader: a takeover request
	// left in the directory is from a process that no longer leads.
	_ = os.Remove(s.requestPath())
	id, err := b.InitInternalProducer(ctx, producerName)
	if err != nil {
		s.closeBroker()
		return fmt.Errorf("embedded sink: taking the relay's producer identity: %w", err)
	}
	st := state{LogID: b.LogID(), ProducerID: id.ID, Acked: map[string]map[int32]int64{}}
	if saved.LogID == st.LogID && saved.Acked != nil {
		st.Acked = saved.Acked
	}
	ids := map[int64]bool{id.ID: true}
	if session.State != nil {
		ids[saved.ProducerID] = true
	}
	seen, err := unacknowledged(ctx, s.cfg.Logger, b, st, ids)
	if err == nil && saved.LogID == st.LogID {
		err = heldAgain(ctx, s.cfg.Logger, b, saved.Held, seen)
	}
	if err != nil {
		s.closeBroker()
		return err
	}
	if len(seen) > 0 {
		s.cfg.Logger.Info("the log holds unacknowledged events; they will not be appended again", "events", len(seen))
	}
	_ = os.Remove(filepath.Join(s.cfg.Broker.Dir, legacyIdentityFile))
	s.id, s.st, s.seen, s.held = id, st, seen, maps.Clone(seen)
	s.seq, s.topics = map[tp]int32{}, map[string]broker.TopicConfig{}
	s.mu.Lock()
	s.fence, s.inSession = session.CheckFence, true
	s.placements = session.Placements
	s.mu.Unlock()
	return nil
}

// takeoverRequest is the file a process that wants the data directory
// writes into it while it waits for the lock: a process keeping the broker
// open between sessions closes it when it sees the file.
const takeoverRequest = "TAKEOVER-REQUEST"

func (s *Sink) requestPath() string { return filepath.Join(s.cfg.Broker.Dir, takeoverRequest) }

// lingerPoll is how often a broker kept open between sessions looks for a
// takeover request.
const lingerPoll = 100 * time.Millisecond

// open opens the broker, waiting while another process holds the
// directory.
func (s *Sink) open(ctx context.Context) (*broker.Broker, error) {
	// Ask first: a process that keeps the directory open between its
	// sessions gives it up when it sees the request.
	if err := os.WriteFile(s.requestPath(), fmt.Appendf(nil, "pid %d\n", os.Getpid()), 0o644); err != nil {
		return nil, fmt.Errorf("embedded sink: asking for the data directory: %w", err)
	}
	defer os.Remove(s.requestPath())
	for waited := false; ; waited = true {
		b, err := broker.Open(ctx, s.cfg.Broker)
		if err == nil {
			return b, nil
		}
		if !errors.Is(err, syscall.EWOULDBLOCK) {
			return nil, fmt.Errorf("embedded sink: opening the broker: %w", err)
		}
		if !waited {
			s.cfg.Logger.Info("waiting for another process to release the data directory", "dir", s.cfg.Broker.Dir)
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// unacknowledged reads, in every partition, the batches of the producers
// ids from st's acknowledged offset (or, where st names none, from the log
// start where the broker knows one of ids) to the end, and returns the
// identities of their records.
func unacknowledged(ctx context.Context, logger *slog.Logger, b *broker.Broker, st state, ids map[int64]bool) (map[string]logPos, error) {
	seen := map[string]logPos{}
	var buf []byte
	for _, t := range b.Topics() {
		for _, p := range t.Partitions {
			k := tp{t.Name, p.Partition}
			from, ok := st.acked(k)
			if !ok && !wroteTo(b, k, ids) {
				continue
			}
			earliest, latest, err := b.Offsets(k.topic, k.partition)
			if err != nil {
				return nil, fmt.Errorf("embedded sink: %s/%d: %w", k.topic, k.partition, err)
			}
			if buf, err = readIdentities(ctx, logger, b, k, max(from, earliest), latest, ids, seen, buf); err != nil {
				return nil, err
			}
		}
	}
	return seen, nil
}

// heldAgain adds to seen the identities of the held records a saved state
// names, those the log still has.
func heldAgain(ctx context.Context, logger *slog.Logger, b *broker.Broker, held []heldRange, seen map[string]logPos) error {
	var buf []byte
	for _, h := range held {
		k := tp{h.Topic, h.Partition}
		earliest, latest, err := b.Offsets(k.topic, k.partition)
		if errors.Is(err, broker.ErrUnknownTopicOrPartition) {
			continue // deleted since: nothing of it to append again
		}
		if err != nil {
			return fmt.Errorf("embedded sink: %s/%d: %w", k.topic, k.partition, err)
		}
		found := map[string]logPos{}
		if buf, err = readIdentities(ctx, logger, b, k, max(h.From, earliest), min(h.To, latest), map[int64]bool{h.Producer: true}, found, buf); err != nil {
			return err
		}
		for id, pos := range found {
			if pos.offset >= h.From && pos.offset < h.To {
				seen[id] = pos
			}
		}
	}
	return nil
}

// readIdentities adds to seen the identities of the records of ids in
// partition k from offset from up to to, reading into buf (returned for
// reuse). A range the broker reports lost (damaged on disk) is passed
// over: its records' identities cannot be read, so their events are
// appended again when they come, which puts them back in the log, where
// refusing to start would stop the relay for good.
func readIdentities(ctx context.Context, logger *slog.Logger, b *broker.Broker, k tp, from, to int64, ids map[int64]bool, seen map[string]logPos, buf []byte) ([]byte, error) {
	for from < to {
		if err := ctx.Err(); err != nil {
			return buf, err
		}
		res, err := b.FetchInto(ctx, k.topic, k.partition, from, 4<<20, buf[:0])
		if first, last, ok := broker.LostOffsets(err); ok && last >= from {
			logger.Warn("unacknowledged records are lost from the log; their events will be appended again when they come",
				"topic", k.topic, "partition", k.partition, "first_offset", max(first, from), "last_offset", last)
			from = last + 1
			continue
		}
		if err != nil {
			return buf, fmt.Errorf("embedded sink: reading the unacknowledged records of %s/%d at %d: %w", k.topic, k.partition, from, err)
		}
		buf = res.Batches
		next, err := collectIdentities(k, res.Batches, ids, seen)
		if err != nil {
			return buf, fmt.Errorf("embedded sink: reading the unacknowledged records of %s/%d at %d: %w", k.topic, k.partition, from, err)
		}
		if next <= from {
			break
		}
		from = next
	}
	return buf, nil
}

// wroteTo reports whether one of ids has producer state in k.
func wroteTo(b *broker.Broker, k tp, ids map[int64]bool) bool {
	for id := range ids {
		if _, ok, err := b.ProducerState(k.topic, k.partition, id); err == nil && ok {
			return true
		}
	}
	return false
}

// collectIdentities adds to seen the identities of the records in the
// batches of ids, in partition k, and returns the offset after the last
// batch.
func collectIdentities(k tp, batches []byte, ids map[int64]bool, seen map[string]logPos) (int64, error) {
	next := int64(-1)
	for raw, err := range broker.Batches(batches) {
		if err != nil {
			return 0, err
		}
		h, err := broker.ParseBatchHeader(raw)
		if err != nil {
			return 0, err
		}
		next = h.LastOffset() + 1
		if !ids[h.ProducerID] || h.Control() {
			continue
		}
		_, recs, err := broker.DecodeBatch(raw)
		if err != nil {
			return 0, err
		}
		for _, r := range recs {
			var eventID, replay []byte
			for _, hd := range r.Headers {
				switch hd.Key {
				case relay.HeaderEventID:
					eventID = hd.Value
				case relay.HeaderReplay:
					replay = hd.Value
				}
			}
			if id := relay.Identity(eventID, replay); id != "" {
				seen[id] = logPos{key: k, offset: r.Offset, producer: h.ProducerID}
			}
		}
	}
	return next, nil
}

// startLinger watches the data directory for a takeover request while the
// broker is open between sessions, and closes the broker on one.
func (s *Sink) startLinger() {
	stop, done := make(chan struct{}), make(chan struct{})
	s.mu.Lock()
	s.lingerStop, s.lingerDone = stop, done
	s.mu.Unlock()
	go func() {
		defer close(done)
		tick := time.NewTicker(lingerPoll)
		defer tick.Stop()
		for {
			select {
			case <-stop:
				return
			case <-tick.C:
			}
			if _, err := os.Stat(s.requestPath()); err == nil {
				s.cfg.Logger.Info("another relay asked for the data directory; closing the broker and its listener", "dir", s.cfg.Broker.Dir)
				if err := s.closeBroker(); err != nil {
					s.cfg.Logger.Error("closing the broker", "err", err)
				}
				return
			}
		}
	}()
}

// stopLinger ends the watch of startLinger, if one runs, and waits for it.
func (s *Sink) stopLinger() {
	s.mu.Lock()
	stop, done := s.lingerStop, s.lingerDone
	s.lingerStop, s.lingerDone = nil, nil
	s.mu.Unlock()
	if stop != nil {
		close(stop)
		<-done
	}
}

// Standby closes a broker kept open between sessions: another relay leads
// now, and this one's log is no longer the one being written (or is about
// to be another process's).
func (s *Sink) Standby() {
	s.mu.Lock()
	in := s.inSession
	s.mu.Unlock()
	if in {
		return
	}
	s.stopLinger()
	if err := s.closeBroker(); err != nil {
		s.cfg.Logger.Error("closing the broker", "err", err)
	}
}

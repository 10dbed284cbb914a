package broker

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"hash/crc32"
	"log/slog"
	"path/filepath"
	"sort"
	"sync"
	"time"
)

// TxnState is a transaction's state, named as Kafka names them.
type TxnState string

// The states of a transactional id.
const (
	TxnEmpty          TxnState = "Empty"
	TxnOngoing        TxnState = "Ongoing"
	TxnPrepareCommit  TxnState = "PrepareCommit"
	TxnPrepareAbort   TxnState = "PrepareAbort"
	TxnCompleteCommit TxnState = "CompleteCommit"
	TxnCompleteAbort  TxnState = "CompleteAbort"
)

// TxnPartition is a partition in a transaction.
type TxnPartition struct {
	Topic     string `json:"topic"`
	Partition int32  `json:"partition"`
}

// TxnOffset is a group offset pending in a transaction.
type TxnOffset struct {
	Group       string `json:"group"`
	Topic       string `json:"topic"`
	Partition   int32  `json:"partition"`
	Offset      int64  `json:"offset"`
	LeaderEpoch int32  `json:"leader_epoch"`
	Metadata    string `json:"metadata,omitempty"`
}

// TxnStatus is the coordinator's state of one transactional id; it is
// also the payload of a frame of txns/state.log.
type TxnStatus struct {
	TransactionalID string `json:"id"`
	ProducerID      int64  `json:"producer_id"`
	Epoch           int16  `json:"epoch"`
	// TimedOutEpoch is the epoch the coordinator fenced when it aborted a
	// transaction past its timeout, until the next InitProducerId: its
	// producer may still end that transaction as aborted and re-initialise
	// with it (KIP-588), which a zombie fenced by a newer instance may not.
	TimedOutEpoch *int16         `json:"timed_out_epoch,omitempty"`
	TimeoutMs     int32          `json:"timeout_ms"`
	State         TxnState       `json:"state"`
	Partitions    []TxnPartition `json:"partitions,omitempty"`
	Groups        []string       `json:"groups,omitempty"`
	Offsets       []TxnOffset    `json:"offsets,omitempty"`
	// StartMs is when the current transaction began (unix ms), -1 when
	// none is open.
	StartMs  int64 `json:"start_ms"`
	UpdateMs int64 `json:"update_ms"`
}

func (s TxnStatus) clone() TxnStatus {
	s.Partitions = append([]TxnPartition(nil), s.Partitions...)
	s.Groups = append([]string(nil), s.Groups...)
	s.Offsets = append([]TxnOffset(nil), s.Offsets...)
	return s
}

// timedOut reports whether pid is the identity whose transaction the
// coordinator aborted on its timeout (and nothing happened since).
func (s TxnStatus) timedOut(pid ProducerID) bool {
	return s.TimedOutEpoch != nil && s.State == TxnCompleteAbort && pid.ID == s.ProducerID && pid.Epoch == *s.TimedOutEpoch
}

func (s TxnStatus) hasPartition(topic string, part int32) bool {
	for _, p := range s.Partitions {
		if p.Topic == topic && p.Partition == part {
			return true
		}
	}
	return false
}

func (s TxnStatus) hasGroup(g string) bool {
	for _, x := range s.Groups {
		if x == g {
			return true
		}
	}
	return false
}

// maxTxnEpoch is the highest epoch a transactional id uses before it moves
// to a fresh producer id (Kafka: Short.MaxValue - 1).
const maxTxnEpoch = 1<<15 - 2

// txnStateCompactBytes is the size past which the state file is rewritten
// with live entries only, when at least half of it is superseded.
const txnStateCompactBytes = 4 << 20

const txnStateFile = "state.log"

// txnCoordinator is the transaction coordinator of one open of the broker.
// Lock order: an entry's mu, then partitions (appends), then the group
// store and fileMu; mu (the maps) is never held while taking an entry's.
type txnCoordinator struct {
	b      *Broker
	fs     FS
	dir    string
	logger *slog.Logger
	health *health

	mu      sync.Mutex
	entries map[string]*txnEntry
	byPID   map[int64]*txnEntry

	fileMu sync.Mutex
	f      File
	size   int64
	frames map[string][]byte // the newest frame of each id
}

// txnEntry is one transactional id. Its mu is held for reading by a
// transactional append while it checks the state and writes, and for
// writing by every state change, so no batch lands after its markers.
type txnEntry struct {
	mu sync.RWMutex
	st TxnStatus
}

func encodeTxnFrame(st TxnStatus) []byte {
	p, _ := json.Marshal(st)
	b := binary.BigEndian.AppendUint32(make([]byte, 0, 8+len(p)), uint32(len(p)))
	b = binary.BigEndian.AppendUint32(b, crc32.Checksum(p, castagnoli))
	return append(b, p...)
}

func parseTxnFrame(b []byte) (TxnStatus, int, error) {
	var st TxnStatus
	if len(b) < 8 {
		return st, 0, errBadOffsetFrame
	}
	n := binary.BigEndian.Uint32(b)
	if uint64(n) > uint64(len(b)-8) {
		return st, 0, errBadOffsetFrame
	}
	p := b[8 : 8+n]
	if crc32.Checksum(p, castagnoli) != binary.BigEndian.Uint32(b[4:]) {
		return st, 0, errBadOffsetFrame
	}
	if err := json.Unmarshal(p, &st); err != nil || st.TransactionalID == "" {
		return st, 0, errBadOffsetFrame
	}
	return st, int(8 + n), nil
}

func openTxnCoordinator(b *Broker, h *health) (*txnCoordinator, error) {
	fsys := b.opts.FS
	dir := filepath.Join(b.opts.Dir, "txns")
	if err := fsys.MkdirAll(dir, 0o755); err != nil {
		return nil, storageErr("create txns dir", err)
	}
	c := &txnCoordinator{b: b, fs: fsys, dir: dir, logger: b.opts.Logger, health: h,
		entries: map[string]*txnEntry{}, byPID: map[int64]*txnEntry{}, frames: map[string][]byte{}}
	f, size, err := loadFrameLog(fsys, filepath.Join(dir, txnStateFile), c.logger, "transaction state", func(b []byte) (int, error) {
		st, n, err := parseTxnFrame(b)
		if err != nil {
			return 0, err
		}
		c.frames[st.TransactionalID] = b[:n:n]
		c.setLocked(st)
		return n, nil
	})
	if err != nil {
		return nil, err
	}
	c.f, c.size = f, size
	return c, nil
}

// setLocked installs st as the entry of its id (while loading).
func (c *txnCoordinator) setLocked(st TxnStatus) {
	e := c.entries[st.TransactionalID]
	if e == nil {
		e = &txnEntry{}
		c.entries[st.TransactionalID] = e
	}
	if e.st.ProducerID >= 0 && c.byPID[e.st.ProducerID] == e {
		delete(c.byPID, e.st.ProducerID)
	}
	e.st = st
	if st.ProducerID >= 0 {
		c.byPID[st.ProducerID] = e
	}
}

func (c *txnCoordinator) close() error {
	c.fileMu.Lock()
	defer c.fileMu.Unlock()
	return closeFrameLog(&c.f)
}

// persist writes st durably (one fsync) and only then installs it in e,
// which the caller holds locked.
func (c *txnCoordinator) persist(e *txnEntry, st TxnStatus) error {
	st.UpdateMs = c.b.opts.Now().UnixMilli()
	frame := encodeTxnFrame(st)
	c.fileMu.Lock()
	if err := appendFrames(c.f, c.size, c.health, frame, "transaction state"); err != nil {
		c.fileMu.Unlock()
		return err
	}
	c.size += int64(len(frame))
	c.frames[st.TransactionalID] = frame
	if c.size > txnStateCompactBytes {
		if err := c.compactLocked(); err != nil {
			c.logger.Warn("transaction state compaction failed", "err", err)
		}
	}
	c.fileMu.Unlock()

	c.mu.Lock()
	if e.st.ProducerID >= 0 && e.st.ProducerID != st.ProducerID && c.byPID[e.st.ProducerID] == e {
		delete(c.byPID, e.st.ProducerID)
	}
	e.st = st
	c.byPID[st.ProducerID] = e
	c.mu.Unlock()
	return nil
}

func (c *txnCoordinator) compactLocked() error {
	ids := make([]string, 0, len(c.frames))
	var live int64
	for id, f := range c.frames {
		ids = append(ids, id)
		live += int64(len(f))
	}
	if live*2 > c.size {
		return nil
	}
	sort.Strings(ids)
	buf := make([]byte, 0, live)
	for _, id := range ids {
		buf = append(buf, c.frames[id]...)
	}
	return replaceFrameLog(c.fs, filepath.Join(c.dir, txnStateFile), &c.f, &c.size, buf)
}

// existing returns the entry of a transactional id that InitProducerId
// made, or ErrUnknownTransactionalID.
func (c *txnCoordinator) existing(id string) (*txnEntry, error) {
	if e := c.entry(id, false); e != nil {
		return e, nil
	}
	return nil, fmt.Errorf("%w: %s", ErrUnknownTransactionalID, id)
}

func (c *txnCoordinator) entry(id string, create bool) *txnEntry {
	c.mu.Lock()
	defer c.mu.Unlock()
	e := c.entries[id]
	if e == nil && create {
		e = &txnEntry{st: TxnStatus{TransactionalID: id, ProducerID: -1, Epoch: -1, State: TxnEmpty, StartMs: -1}}
		c.entries[id] = e
	}
	return e
}

func (c *txnCoordinator) list() []*txnEntry {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make([]*txnEntry, 0, len(c.entries))
	for _, e := range c.entries {
		out = append(out, e)
	}
	return out
}

// checkProducer validates a request's producer id and epoch against the
// id's current ones.
func checkProducer(st TxnStatus, pid ProducerID) error {
	switch {
	case st.ProducerID < 0:
		return fmt.Errorf("%w: %s", ErrUnknownTransactionalID, st.TransactionalID)
	case pid.ID != st.ProducerID:
		return fmt.Errorf("%w: %s has producer id %d, request %d", ErrInvalidProducerIDMapping, st.TransactionalID, st.ProducerID, pid.ID)
	case pid.Epoch < st.Epoch:
		return fmt.Errorf("%w: %s epoch %d, current %d", ErrProducerFenced, st.TransactionalID, pid.Epoch, st.Epoch)
	case pid.Epoch > st.Epoch:
		return fmt.Errorf("%w: %s epoch %d, current %d", ErrInvalidProducerEpoch, st.TransactionalID, pid.Epoch, st.Epoch)
	}
	return nil
}

// finishLocked ends e's transaction at epoch: the decision is made durable
// first (PrepareCommit or PrepareAbort), then a marker is written to every
// partition and made durable, then (commit) the pending offsets are stored,
// then the transaction is completed. A failure leaves the Prepare state,
// which EndTxn, the timeout loop and recovery finish later.
func (c *txnCoordinator) finishLocked(ctx context.Context, e *txnEntry, commit bool, epoch int16) error {
	prepare, complete := TxnPrepareAbort, TxnCompleteAbort
	if commit {
		prepare, complete = TxnPrepareCommit, TxnCompleteCommit
	}
	st := e.st.clone()
	if st.State != prepare || st.Epoch != epoch {
		st.State, st.Epoch = prepare, epoch
		if err := c.persist(e, st); err != nil {
			return err
		}
	}
	// Decided: finish even if the request that decided goes away.
	ctx = context.WithoutCancel(ctx)
	nowMs := c.b.opts.Now().UnixMilli()
	var waits []func() error
	var errs []error
	for _, tp := range st.Partitions {
		wait, err := c.b.appendMarker(ctx, tp.Topic, tp.Partition, markerBatch(st.ProducerID, epoch, commit, nowMs))
		if errors.Is(err, ErrUnknownTopicOrPartition) {
			// Deleted meanwhile (DeleteTopics): nothing is left to end.
			c.logger.Warn("transaction partition deleted before its marker", "transactional_id", st.TransactionalID, "topic", tp.Topic, "partition", tp.Partition)
			continue
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("marker to %s/%d: %w", tp.Topic, tp.Partition, err))
			continue
		}
		waits = append(waits, wait)
	}
	for _, w := range waits {
		errs = append(errs, w())
	}
	if err := errors.Join(errs...); err != nil {
		return err
	}
	if commit && len(st.Offsets) > 0 {
		byGroup := map[string][]OffsetCommit{}
		var groups []string
		for _, o := range st.Offsets {
			if _, ok := byGroup[o.Group]; !ok {
				groups = append(groups, o.Group)
			}
			byGroup[o.Group] = append(byGroup[o.Group], OffsetCommit{Topic: o.Topic, Partition: o.Partition, Offset: o.Offset, LeaderEpoch: o.LeaderEpoch, Metadata: o.Metadata})
		}
		for _, g := range groups {
			if err := c.b.groupStore().commit(g, byGroup[g], c.b.opts.Now()); err != nil {
				return fmt.Errorf("transactional offsets of group %s: %w", g, err)
			}
		}
	}
	st.State, st.Partitions, st.Groups, st.Offsets = complete, nil, nil, nil
	return c.persist(e, st)
}

// appendMarker writes a control batch to a partition and returns the wait
// for its durability.
func (b *Broker) appendMarker(ctx context.Context, topicName string, part int32, batch []byte) (func() error, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if err := b.health.Load().check(); err != nil {
		return nil, err
	}
	_, p, err := b.lookup(topicName, part, false)
	if err != nil {
		return nil, err
	}
	h, err := ParseBatchHeader(batch)
	if err != nil {
		return nil, err
	}
	_, target, gen, err := p.write(batch, h)
	if err != nil {
		return nil, err
	}
	if target < 0 {
		// SyncIntervalUnsafe acknowledges appends unsynced, but a
		// marker must be on disk before the transaction is completed:
		// a lost marker would leave the partition's transaction open
		// for good.
		return p.sync, nil
	}
	return func() error { return p.waitDurable(target, gen) }, nil
}

// recover finishes the transactions a crash left between decision and
// completion. Ongoing ones stay open.
func (c *txnCoordinator) recover(ctx context.Context) {
	for _, e := range c.list() {
		e.mu.Lock()
		if s := e.st.State; s == TxnPrepareCommit || s == TxnPrepareAbort {
			c.logger.Info("completing a transaction decided before the restart", "transactional_id", e.st.TransactionalID, "state", s)
			if err := c.finishLocked(ctx, e, s == TxnPrepareCommit, e.st.Epoch); err != nil {
				c.logger.Error("completing a transaction failed; will retry", "transactional_id", e.st.TransactionalID, "err", err)
			}
		}
		e.mu.Unlock()
	}
}

// expire aborts transactions open longer than their timeout, bumping the
// epoch so the producer that abandoned them is fenced, and retries the
// completion of decided ones.
func (c *txnCoordinator) expire(ctx context.Context) {
	now := c.b.opts.Now().UnixMilli()
	for _, e := range c.list() {
		if ctx.Err() != nil {
			return
		}
		e.mu.Lock()
		st := e.st
		var err error
		switch {
		case st.State == TxnOngoing && st.StartMs >= 0 && now-st.StartMs > int64(st.TimeoutMs):
			c.logger.Warn("aborting a transaction past its timeout", "transactional_id", st.TransactionalID,
				"producer_id", st.ProducerID, "epoch", st.Epoch, "timeout_ms", st.TimeoutMs)
			fenced := st.Epoch
			e.st.TimedOutEpoch = &fenced
			err = c.finishLocked(ctx, e, false, bumpEpoch(st.Epoch))
		case st.State == TxnPrepareCommit || st.State == TxnPrepareAbort:
			err = c.finishLocked(ctx, e, st.State == TxnPrepareCommit, st.Epoch)
		}
		e.mu.Unlock()
		if err != nil && ctx.Err() == nil {
			c.logger.Error("ending a transaction failed; will retry", "transactional_id", st.TransactionalID, "err", err)
		}
	}
}

func bumpEpoch(e int16) int16 {
	if e < maxTxnEpoch {
		return e + 1
	}
	return e
}

func (b *Broker) txnLoop() {
	defer b.wg.Done()
	everyTick(b.stop, b.opts.TxnCheckInterval, func(ctx context.Context) {
		if c := b.txnCoordinator(); c != nil {
			c.expire(ctx)
		}
	})
}

func (b *Broker) txnCoordinator() *txnCoordinator {
	b.mu.RLock()
	defer b.mu.RUnlock()
	return b.txns
}

func (b *Broker) coordinator() (*txnCoordinator, error) {
	c := b.txnCoordinator()
	if c == nil {
		return nil, ErrClosed
	}
	return c, nil
}

// lockTxn returns the coordinator and the entry InitProducerId made for
// txnID, with the entry's lock held: the caller unlocks e.mu. Each of
// known must be a partition the broker has (ErrUnknownTopicOrPartition
// otherwise); that is checked once the coordinator is found open, before
// the entry is looked up.
func (b *Broker) lockTxn(txnID string, known []TxnPartition) (*txnCoordinator, *txnEntry, error) {
	c, err := b.coordinator()
	if err != nil {
		return nil, nil, err
	}
	for _, tp := range known {
		if _, _, err := b.lookup(tp.Topic, tp.Partition, false); err != nil {
			return nil, nil, err
		}
	}
	e, err := c.existing(txnID)
	if err != nil {
		return nil, nil, err
	}
	e.mu.Lock()
	return c, e, nil
}

// InitTransactional gives the producer of a transactional id its identity
// for a new session: the same producer id at the next epoch (a fresh id
// once the epoch would overflow), which fences every older instance. A
// transaction the previous instance left open is aborted first, under the
// bumped epoch. current, when its ID is not -1, is the identity the
// producer holds (KIP-360): it must be the id's current one. timeout is
// the producer's transaction.timeout.ms.
func (b *Broker) InitTransactional(ctx context.Context, txnID string, timeout time.Duration, current ProducerID) (ProducerID, error) {
	if txnID == "" || len(txnID) > 1<<15 {
		return ProducerID{}, fmt.Errorf("%w: transactional id length %d", ErrInvalidConfig, len(txnID))
	}
	if timeout <= 0 || timeout > b.opts.MaxTxnTimeout {
		return ProducerID{}, fmt.Errorf("%w: %v (maximum %v)", ErrInvalidTransactionTimeout, timeout, b.opts.MaxTxnTimeout)
	}
	c, err := b.coordinator()
	if err != nil {
		return ProducerID{}, err
	}
	e := c.entry(txnID, true)
	e.mu.Lock()
	defer e.mu.Unlock()
	if current.ID >= 0 && !e.st.timedOut(current) {
		if err := checkProducer(e.st, current); err != nil {
			if errors.Is(err, ErrInvalidProducerEpoch) {
				err = fmt.Errorf("%w: %w", ErrProducerFenced, err)
			}
			return ProducerID{}, err
		}
	}
	switch e.st.State {
	case TxnOngoing:
		c.logger.Info("aborting the transaction a previous producer left open", "transactional_id", txnID,
			"producer_id", e.st.ProducerID, "epoch", e.st.Epoch)
		if err := c.finishLocked(ctx, e, false, bumpEpoch(e.st.Epoch)); err != nil {
			return ProducerID{}, fmt.Errorf("%w: aborting the open transaction: %w", ErrConcurrentTransactions, err)
		}
	case TxnPrepareCommit, TxnPrepareAbort:
		if err := c.finishLocked(ctx, e, e.st.State == TxnPrepareCommit, e.st.Epoch); err != nil {
			return ProducerID{}, fmt.Errorf("%w: %w", ErrConcurrentTransactions, err)
		}
	}
	st := e.st.clone()
	if st.ProducerID < 0 || st.Epoch >= maxTxnEpoch {
		id, err := b.initProducerID(ctx, "", false)
		if err != nil {
			return ProducerID{}, err
		}
		st.ProducerID, st.Epoch = id.ID, 0
	} else {
		st.Epoch++
	}
	st.State, st.TimeoutMs, st.StartMs, st.TimedOutEpoch = TxnEmpty, int32(timeout/time.Millisecond), -1, nil
	st.Partitions, st.Groups, st.Offsets = nil, nil, nil
	if err := c.persist(e, st); err != nil {
		return ProducerID{}, err
	}
	return ProducerID{ID: st.ProducerID, Epoch: st.Epoch}, nil
}

// beginLocked checks pid and moves a finished or empty transaction to
// Ongoing (in st, not yet persisted).
func beginLocked(e *txnEntry, pid ProducerID, nowMs int64) (TxnStatus, error) {
	if err := checkProducer(e.st, pid); err != nil {
		return TxnStatus{}, err
	}
	st := e.st.clone()
	switch st.State {
	case TxnPrepareCommit, TxnPrepareAbort:
		return TxnStatus{}, fmt.Errorf("%w: %s is %s", ErrConcurrentTransactions, st.TransactionalID, st.State)
	case TxnOngoing:
	default:
		st.State, st.StartMs = TxnOngoing, nowMs
		st.Partitions, st.Groups, st.Offsets = nil, nil, nil
	}
	return st, nil
}

// beginTxn is lockTxn and then beginLocked: it returns the entry of txnID
// locked (the caller unlocks e.mu) and the state that starts or continues
// pid's transaction, not yet persisted.
func (b *Broker) beginTxn(txnID string, pid ProducerID, known []TxnPartition) (*txnCoordinator, *txnEntry, TxnStatus, error) {
	c, e, err := b.lockTxn(txnID, known)
	if err != nil {
		return nil, nil, TxnStatus{}, err
	}
	st, err := beginLocked(e, pid, b.opts.Now().UnixMilli())
	if err != nil {
		e.mu.Unlock()
		return nil, nil, TxnStatus{}, err
	}
	return c, e, st, nil
}

// AddTxnPartitions adds partitions to the producer's transaction, starting
// it if none is open; it returns once that is durable. Unknown partitions
// fail the whole request (errors.Is ErrUnknownTopicOrPartition).
func (b *Broker) AddTxnPartitions(ctx context.Context, txnID string, pid ProducerID, parts []TxnPartition) error {
	c, e, st, err := b.beginTxn(txnID, pid, parts)
	if err != nil {
		return err
	}
	defer e.mu.Unlock()
	changed := st.State != e.st.State
	for _, tp := range parts {
		if !st.hasPartition(tp.Topic, tp.Partition) {
			st.Partitions = append(st.Partitions, tp)
			changed = true
		}
	}
	if !changed {
		return nil
	}
	return c.persist(e, st)
}

// AddTxnGroup adds a consumer group to the producer's transaction, so that
// TxnCommitOffsets may commit its offsets in it.
func (b *Broker) AddTxnGroup(ctx context.Context, txnID string, pid ProducerID, group string) error {
	if group == "" || len(group) > 1<<15 {
		return fmt.Errorf("%w: group id length %d", ErrInvalidConfig, len(group))
	}
	c, e, st, err := b.beginTxn(txnID, pid, nil)
	if err != nil {
		return err
	}
	defer e.mu.Unlock()
	if st.State == e.st.State && st.hasGroup(group) {
		return nil
	}
	if !st.hasGroup(group) {
		st.Groups = append(st.Groups, group)
	}
	return c.persist(e, st)
}

// TxnCommitOffsets records group offsets in the producer's open
// transaction (durably); they replace the group's committed offsets only
// when the transaction commits. Unknown partitions fail the request.
func (b *Broker) TxnCommitOffsets(ctx context.Context, txnID string, pid ProducerID, group string, commits []OffsetCommit) error {
	known := make([]TxnPartition, len(commits))
	for i, oc := range commits {
		known[i] = TxnPartition{Topic: oc.Topic, Partition: oc.Partition}
	}
	c, e, err := b.lockTxn(txnID, known)
	if err != nil {
		return err
	}
	defer e.mu.Unlock()
	if err := checkProducer(e.st, pid); err != nil {
		return err
	}
	if e.st.State != TxnOngoing || !e.st.hasGroup(group) {
		return fmt.Errorf("%w: %s is %s and has not added group %s", ErrInvalidTxnState, txnID, e.st.State, group)
	}
	st := e.st.clone()
	for _, oc := range commits {
		o := TxnOffset{Group: group, Topic: oc.Topic, Partition: oc.Partition, Offset: oc.Offset, LeaderEpoch: oc.LeaderEpoch, Metadata: oc.Metadata}
		replaced := false
		for i := range st.Offsets {
			if x := &st.Offsets[i]; x.Group == group && x.Topic == oc.Topic && x.Partition == oc.Partition {
				*x, replaced = o, true
			}
		}
		if !replaced {
			st.Offsets = append(st.Offsets, o)
		}
	}
	return c.persist(e, st)
}

// EndTxn commits or aborts the producer's transaction and returns once the
// markers are written and durable (and, on commit, the offsets stored). A
// repeated EndTxn with the same decision succeeds again.
func (b *Broker) EndTxn(ctx context.Context, txnID string, pid ProducerID, commit bool) error {
	c, e, err := b.lockTxn(txnID, nil)
	if err != nil {
		return err
	}
	defer e.mu.Unlock()
	if !commit && e.st.timedOut(pid) {
		// The producer aborting the transaction the coordinator already
		// aborted for it.
		return nil
	}
	if err := checkProducer(e.st, pid); err != nil {
		return err
	}
	switch s := e.st.State; {
	case s == TxnOngoing:
		return c.finishLocked(ctx, e, commit, e.st.Epoch)
	case s == TxnPrepareCommit && commit, s == TxnPrepareAbort && !commit:
		return c.finishLocked(ctx, e, commit, e.st.Epoch)
	case s == TxnCompleteCommit && commit, s == TxnCompleteAbort && !commit:
		return nil
	case s == TxnPrepareCommit, s == TxnPrepareAbort:
		return fmt.Errorf("%w: %s is %s", ErrConcurrentTransactions, txnID, s)
	default:
		return fmt.Errorf("%w: %s is %s, cannot %s", ErrInvalidTxnState, txnID, s, map[bool]string{true: "commit", false: "abort"}[commit])
	}
}

// ProduceTxnAsync is ProduceAsync for a producer with a transactional id:
// a transactional batch is appended only when it carries the id's producer
// id and current epoch and its transaction is Ongoing with the partition
// added (ErrInvalidProducerEpoch for a fenced producer, ErrInvalidTxnState
// otherwise).
func (b *Broker) ProduceTxnAsync(ctx context.Context, txnID, topicName string, part int32, batch []byte) (AppendResult, func() error, error) {
	h, err := ParseBatchHeader(batch)
	if err != nil || !h.Transactional() || h.Control() {
		return b.ProduceAsync(ctx, topicName, part, batch)
	}
	c, err := b.coordinator()
	if err != nil {
		return AppendResult{}, nil, err
	}
	c.mu.Lock()
	e := c.byPID[h.ProducerID]
	c.mu.Unlock()
	if e == nil {
		return AppendResult{}, nil, fmt.Errorf("%w: producer id %d", ErrInvalidProducerIDMapping, h.ProducerID)
	}
	e.mu.RLock()
	defer e.mu.RUnlock()
	st := e.st
	switch {
	case st.TransactionalID != txnID || st.ProducerID != h.ProducerID:
		return AppendResult{}, nil, fmt.Errorf("%w: producer id %d is not %s's", ErrInvalidProducerIDMapping, h.ProducerID, txnID)
	case h.ProducerEpoch != st.Epoch:
		return AppendResult{}, nil, fmt.Errorf("%w: %s epoch %d, current %d", ErrInvalidProducerEpoch, txnID, h.ProducerEpoch, st.Epoch)
	case st.State != TxnOngoing || !st.hasPartition(topicName, part):
		return AppendResult{}, nil, fmt.Errorf("%w: %s is %s without %s/%d", ErrInvalidTxnState, txnID, st.State, topicName, part)
	}
	return b.appendAsync(ctx, topicName, part, batch, true)
}

// Transaction returns the coordinator's state of a transactional id.
func (b *Broker) Transaction(txnID string) (TxnStatus, bool) {
	c := b.txnCoordinator()
	if c == nil {
		return TxnStatus{}, false
	}
	e := c.entry(txnID, false)
	if e == nil {
		return TxnStatus{}, false
	}
	e.mu.RLock()
	defer e.mu.RUnlock()
	if e.st.ProducerID < 0 {
		return TxnStatus{}, false
	}
	return e.st.clone(), true
}

// Transactions lists every transactional id's state, sorted by id.
func (b *Broker) Transactions() []TxnStatus {
	c := b.txnCoordinator()
	if c == nil {
		return nil
	}
	var out []TxnStatus
	for _, e := range c.list() {
		e.mu.RLock()
		if e.st.ProducerID >= 0 {
			out = append(out, e.st.clone())
		}
		e.mu.RUnlock()
	}
	sort.Slice(out, func(i, j int) bool { return out[i].TransactionalID < out[j].TransactionalID })
	return out
}

// TxnOffsetsPending reports whether an open transaction holds offsets for
// the group's partition that are not committed yet (OffsetFetch with
// require_stable answers UNSTABLE_OFFSET_COMMIT then).
func (b *Broker) TxnOffsetsPending(group, topicName string, part int32) bool {
	c := b.txnCoordinator()
	if c == nil {
		return false
	}
	for _, e := range c.list() {
		e.mu.RLock()
		st := e.st
		pending := false
		if st.State != TxnCompleteCommit && st.State != TxnCompleteAbort && st.State != TxnEmpty {
			for _, o := range st.Offsets {
				if o.Group == group && o.Topic == topicName && o.Partition == part {
					pending = true
				}
			}
		}
		e.mu.RUnlock()
		if pending {
			return true
		}
	}
	return false
}

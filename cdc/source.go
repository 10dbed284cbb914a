package cdc

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxrelay/relay/internal/pgconfig"
	"github.com/outboxrelay/relay/relay"
	"github.com/outboxrelay/relay/relay/store"
)

// Source is a relay.Source that streams the outbox table's inserts from a
// logical replication slot. See the package documentation for the
// protocol.
type Source struct {
	cfg Config
	// q are the reader's SQL statements (relay/store).
	q        *store.CDCReader
	log      *slog.Logger
	table    string // <schema>.events, quoted
	slotsTbl string // <schema>.cdc_slots, quoted
	database string // current_database(), for checking the slot
	// slot is the slot name, fixed on the first connection (resolveSlot).
	slot atomic.Pointer[string]

	// Set by Start, cleared by Close.
	pool   *pgxpool.Pool
	cancel context.CancelFunc
	done   chan struct{}

	mu sync.Mutex
	// changed is closed and replaced when the state changes while someone
	// waits (waiters > 0).
	changed chan struct{}
	waiters int
	// queue holds decoded events not yet returned by Next, one chunk per
	// transaction; open is the chunk of the transaction still arriving.
	queue  []*chunk
	open   *chunk
	queued int
	// queuedBytes is the bytes of the queued events (see eventBytes).
	queuedBytes int64
	// chunkHint is the room a new chunk starts with: the events of the
	// last transaction received (less any Next took while it arrived).
	chunkHint int
	// txs are the transactions queued or delivered and not yet wholly
	// acknowledged, in commit order.
	txs []txMark
	// inTx is true between a BEGIN and its COMMIT, and while the table is
	// being read after slot loss.
	inTx bool
	// streamsOpen counts the streamed transactions received in part and
	// not yet committed or aborted: while there are any, the flush
	// position does not move to the server's reported position.
	streamsOpen int
	// acked is the last position passed to Acked (or Start's from).
	acked relay.Position
	// delivered is the last position returned by Next.
	delivered relay.Position
	// flush is the LSN reported to the server as flushed. It only grows.
	flush pglogrepl.LSN
	// serverEnd is the highest WAL position the server has said it has
	// sent everything up to (keepalives, non-transactional messages).
	serverEnd pglogrepl.LSN
	// fatal ends the source: Next returns it.
	fatal error
	// markerDone carries the consistent point of a finished table read, so
	// the housekeeping goroutine marks its cdc_slots row done.
	markerDone chan pglogrepl.LSN
	// textTuples asks for text-format values even from servers that can
	// send binary ones; tests set it to cover the text decoders.
	textTuples bool
	// spillFailures counts the sessions ended by a failed spill (each
	// followed by protocol version 1).
	spillFailures atomic.Int64
}

// chunk is the queued events of one transaction.
type chunk struct {
	major  uint64
	events []relay.Event
	closed bool
}

// txMark is a transaction whose events are queued or delivered: once the
// core acknowledges its last event, the flush position may move to end.
type txMark struct {
	major uint64
	last  uint64
	empty bool
	end   pglogrepl.LSN
	// marker is set for the rows read from the table after slot loss.
	marker bool
}

var (
	_ relay.Source   = (*Source)(nil)
	_ relay.Resetter = (*Source)(nil)
)

// New returns a Source; it connects in Start.
func New(cfg Config) (*Source, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	return &Source{
		cfg:      cfg,
		q:        store.NewCDCReader(cfg.Schema),
		log:      cfg.Logger.With("source", "cdc", "slot", cfg.SlotName),
		table:    pgx.Identifier{cfg.Schema, "events"}.Sanitize(),
		slotsTbl: pgx.Identifier{cfg.Schema, "cdc_slots"}.Sanitize(),
	}, nil
}

// Start checks the server, creates the publication and the slot when they
// are missing, and starts streaming the events after from in the
// background.
//
// When another process streams from the slot, Start returns a
// *SlotActiveError (errors.Is(err, ErrSlotActive)) at once instead of
// waiting; the caller is then a standby and calls Start again later, as
// the relay core does after any failed start.
func (s *Source) Start(ctx context.Context, from relay.Position) error {
	s.Close(ctx)
	conn, err := pgconfig.Connect(ctx, s.cfg.DatabaseURL)
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	if err := s.preflight(ctx, conn); err != nil {
		return err
	}
	if s.database, err = s.q.Database(ctx, conn); err != nil {
		return fmt.Errorf("cdc: %w", err)
	}
	if err := s.resolveSlot(ctx, conn); err != nil {
		return err
	}
	st, err := s.readSlot(ctx, conn, s.slotName())
	if err != nil {
		return err
	}
	if st.exists {
		if err := st.usable(s.slotName(), s.database); err != nil {
			return err
		}
	}
	mk, err := s.readMarker(ctx, conn)
	if err != nil {
		return err
	}
	if !st.exists || st.lost() || !mk.exists || mk.creating() {
		s.reportSlotLoss(st, mk, from)
		if mk, err = s.createSlot(ctx, conn, st); err != nil {
			return err
		}
		st.confirmed = mk.lsn
	}
	s.ensureFailover(ctx, conn)
	if w := s.failoverWarning(ctx, conn); w != "" {
		s.log.Warn(w)
	}

	pool, err := s.connectPool(ctx)
	if err != nil {
		return err
	}
	runCtx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	s.mu.Lock()
	s.pool, s.cancel, s.done = pool, cancel, make(chan struct{})
	s.changed = make(chan struct{})
	s.queue, s.open, s.queued, s.queuedBytes, s.txs, s.inTx, s.streamsOpen = nil, nil, 0, 0, nil, false, 0
	s.acked, s.delivered = from, from
	s.flush, s.serverEnd, s.fatal = st.confirmed, 0, nil
	s.markerDone = make(chan pglogrepl.LSN, 1)
	done := s.done
	s.mu.Unlock()

	markerDone := s.markerDone
	r := &reader{s: s, pool: pool, skipBelow: from, marker: mk, decode: newDecoder(), rels: map[uint32]*relation{},
		prefix: messagePrefix(s.cfg.Schema), streams: map[uint32]*streamTx{}, spillDir: s.cfg.SpillDir}
	var wg sync.WaitGroup
	wg.Add(2)
	go func() {
		defer wg.Done()
		r.run(runCtx)
	}()
	go func() {
		defer wg.Done()
		s.housekeep(runCtx, pool, markerDone)
	}()
	go func() {
		wg.Wait()
		close(done)
	}()
	return nil
}

// slotConn opens a connection for work on the slot and reads the slot's
// state on it; the caller closes the connection.
func (s *Source) slotConn(ctx context.Context) (*pgx.Conn, slotState, error) {
	conn, err := pgconfig.Connect(ctx, s.cfg.DatabaseURL)
	if err != nil {
		return nil, slotState{}, err
	}
	if err := s.resolveSlot(ctx, conn); err != nil {
		conn.Close(context.WithoutCancel(ctx))
		return nil, slotState{}, err
	}
	st, err := s.readSlot(ctx, conn, s.slotName())
	if err != nil {
		conn.Close(context.WithoutCancel(ctx))
		return nil, slotState{}, err
	}
	return conn, st, nil
}

// Reset drops the slot and its creation record, for the core to call when
// the relay switches here from the polling reader: the slot may hold
// inserts the other reader already published (their rows are gone, their
// WAL is not). The next Start creates a new slot and reads the rows still
// in the table, exactly the unpublished ones.
func (s *Source) Reset(ctx context.Context) error {
	conn, st, err := s.slotConn(ctx)
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	if st.exists {
		if err := s.q.DropSlot(ctx, conn, s.slotName()); err != nil {
			return fmt.Errorf("cdc: dropping the slot %q of an earlier run: %w", s.slotName(), err)
		}
		s.log.Warn("dropped the replication slot of an earlier WAL-reader run: another reader has published since", "slot", s.slotName())
	}
	if err := s.q.DeleteMark(ctx, conn, s.slotName()); err != nil {
		return fmt.Errorf("cdc: %w", err)
	}
	return nil
}

// reportSlotLoss says loudly that the slot is gone, unless this is the
// first start.
func (s *Source) reportSlotLoss(st slotState, mk marker, from relay.Position) {
	switch {
	case st.lost():
		s.log.Error("REPLICATION SLOT LOST: the server invalidated it (wal_status = lost, max_slot_wal_keep_size exceeded); recreating it and publishing every unpublished outbox row from the table",
			"publication", s.cfg.PublicationName)
	case mk.creating():
		s.log.Warn("a previous slot creation did not finish; creating the slot again and publishing the unpublished outbox rows from the table")
	case st.exists && !mk.exists:
		s.log.Warn("the slot exists but the relay has no record of creating it, so it cannot tell which outbox rows are older than the slot; recreating it and publishing the unpublished outbox rows from the table")
	case !from.IsZero():
		s.log.Error("REPLICATION SLOT MISSING: it was dropped while events were still being published; recreating it and publishing every unpublished outbox row from the table",
			"last_published", from.String())
	default:
		s.log.Info("creating the replication slot; rows already in the outbox are published from the table")
	}
}

func (s *Source) connectPool(ctx context.Context) (*pgxpool.Pool, error) {
	pool, err := pgconfig.NewPool(ctx, s.cfg.DatabaseURL, 3, nil)
	if err != nil {
		return nil, fmt.Errorf("cdc: %w", err)
	}
	return pool, nil
}

// Close stops streaming and releases the connections. Events not yet
// acknowledged are delivered again by the next Start.
func (s *Source) Close(ctx context.Context) error {
	s.mu.Lock()
	cancel, done, pool := s.cancel, s.done, s.pool
	s.cancel, s.pool = nil, nil
	s.mu.Unlock()
	if cancel == nil {
		return nil
	}
	cancel()
	select {
	case <-done:
	case <-ctx.Done():
		return ctx.Err()
	}
	pool.Close()
	s.fail(errClosed)
	return nil
}

// SlotLag reports how far the slot is behind the server's current WAL
// position: lagBytes up to its confirmed flush position (what is not yet
// acknowledged as published), retainedBytes up to its restart position
// (the WAL the server keeps for it). It works while the source runs.
func (s *Source) SlotLag(ctx context.Context) (lagBytes, retainedBytes int64, err error) {
	s.mu.Lock()
	pool := s.pool
	s.mu.Unlock()
	if pool == nil {
		return 0, 0, errors.New("cdc: SlotLag before Start")
	}
	lagBytes, retainedBytes, found, err := s.q.SlotLag(ctx, pool, s.slotName())
	if err != nil {
		return 0, 0, fmt.Errorf("cdc: reading the slot's lag: %w", err)
	}
	if !found {
		return 0, 0, fmt.Errorf("cdc: replication slot %q does not exist", s.slotName())
	}
	return lagBytes, retainedBytes, nil
}

// waitLocked waits, with s.mu held on entry and on return, until the state
// changes or ctx ends.
func (s *Source) waitLocked(ctx context.Context) error {
	ch := s.changed
	s.waiters++
	s.mu.Unlock()
	var err error
	select {
	case <-ch:
	case <-ctx.Done():
		err = ctx.Err()
	}
	s.mu.Lock()
	s.waiters--
	return err
}

// waitLockedFor is waitLocked that also returns after d.
func (s *Source) waitLockedFor(ctx context.Context, d time.Duration) error {
	ch := s.changed
	s.waiters++
	s.mu.Unlock()
	t := time.NewTimer(d)
	var err error
	select {
	case <-ch:
	case <-t.C:
	case <-ctx.Done():
		err = ctx.Err()
	}
	t.Stop()
	s.mu.Lock()
	s.waiters--
	return err
}

func (s *Source) notifyLocked() {
	if s.waiters > 0 {
		close(s.changed)
		s.changed = make(chan struct{})
	}
}

var errClosed = errors.New("cdc: the source is closed")

// fail ends the source with err; Next returns it.
func (s *Source) fail(err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.fatal == nil {
		s.fatal = err
	}
	s.notifyLocked()
}

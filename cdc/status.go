package cdc

// What the reader sends and writes besides the stream it reads: standby
// status updates, the pause between short reads inside large
// transactions, and the housekeeping (heartbeats, finished table reads).

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"sync/atomic"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgconn/ctxwatch"
	"github.com/jackc/pgx/v5/pgproto3"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxrelay/relay/internal/pgconfig"
)

// statusSender sends standby status updates: when the flush position
// moved, when the interval passed, or when the server asked.
type statusSender struct {
	conn     *pgconn.PgConn
	interval time.Duration
	sent     pglogrepl.LSN
	next     time.Time
}

func (st *statusSender) send(ctx context.Context, s *Source, force bool) error {
	s.mu.Lock()
	flush := s.flush
	s.mu.Unlock()
	now := time.Now()
	if !force && flush == st.sent && now.Before(st.next) {
		return nil
	}
	// Only the flush position matters for a logical slot; write and
	// apply are reported equal to it so nothing suggests more.
	err := pglogrepl.SendStandbyStatusUpdate(ctx, st.conn, pglogrepl.StandbyStatusUpdate{
		WALWritePosition: flush,
		WALFlushPosition: flush,
		WALApplyPosition: flush,
		ClientTime:       now,
	})
	if err != nil {
		return fmt.Errorf("cdc: sending a standby status update: %w", err)
	}
	st.sent, st.next = flush, now.Add(st.interval)
	return nil
}

// connectReplication opens a logical replication connection. A deadline,
// not a cancel request, ends waits on it: a cancel request would abort the
// walsender's stream.
//
// With p set, the connection reads the socket through it (the stream's
// session); without, directly (slot creation).
func (s *Source) connectReplication(ctx context.Context, p *pacer) (*pgconn.PgConn, error) {
	cfg, err := pgconfig.ParseConfig(s.cfg.DatabaseURL)
	if err != nil {
		return nil, err
	}
	pc := cfg.Config.Copy()
	pc.RuntimeParams["replication"] = "database"
	// Text-format values are parsed as ISO dates and hex bytea.
	pc.RuntimeParams["DateStyle"] = "ISO, MDY"
	pc.RuntimeParams["bytea_output"] = "hex"
	if pc.RuntimeParams["application_name"] == "" {
		pc.RuntimeParams["application_name"] = "relay-cdc"
	}
	if pc.ConnectTimeout == 0 {
		pc.ConnectTimeout = 10 * time.Second
	}
	// pgconn reads the socket 8 KiB at a time: a read syscall per ~25
	// messages of a busy stream. A larger buffer in front of it reads
	// whatever the socket holds at once.
	pc.BuildFrontend = func(r io.Reader, w io.Writer) *pgproto3.Frontend {
		if p != nil {
			p.r = r
			r = p
		}
		return pgproto3.NewFrontend(bufio.NewReaderSize(r, replicationReadBuffer), w)
	}
	pc.BuildContextWatcherHandler = func(c *pgconn.PgConn) ctxwatch.Handler {
		return &pgconn.DeadlineContextWatcherHandler{Conn: c.Conn()}
	}
	conn, err := pgconn.ConnectConfig(ctx, pc)
	if err != nil {
		return nil, &scrubbedError{
			msg: fmt.Sprintf("cdc: opening a replication connection to %s: %s", pgconfig.Describe(pc), pgconfig.Scrub(err, s.cfg.DatabaseURL)),
			err: err,
		}
	}
	return conn, nil
}

// replicationReadBuffer is the read buffer of the replication connection.
const replicationReadBuffer = 256 << 10

// A transaction's events are delivered at its commit, so while the reader
// is inside a large one (bulkAfter events received, or a streamed chunk)
// it need not read each message as it arrives: the walsender sends every
// pgoutput message with its own send, and a reader faster than the
// walsender otherwise wakes, reads a few hundred bytes and sleeps again
// for each few messages, a read syscall, an epoll wait and a scheduler
// round trip each (about a third of the relay's CPU in a backlog drain).
// Instead, after a read of less than pauseBelow, the next read waits
// bulkPause first, and gets what the walsender sent meanwhile at once.
// The commit of such a transaction reaches the reader at most about
// bulkPause later; transactions of fewer events, and everything between
// transactions, are read as before.
const (
	bulkAfter  = 64
	bulkPause  = 500 * time.Microsecond
	pauseBelow = 64 << 10
)

// pacer is the replication connection's reader (see bulkAfter). bulk is
// set by the stream's goroutine; Read runs on it too (pgconn's frontend
// reads only in ReceiveMessage), short is Read's own.
type pacer struct {
	r     io.Reader
	bulk  atomic.Bool
	short bool
}

// setBulk says whether the stream is inside a large transaction; a reader
// without a session (in tests) has no pacer.
func (p *pacer) setBulk(on bool) {
	if p != nil {
		p.bulk.Store(on)
	}
}

func (p *pacer) Read(b []byte) (int, error) {
	if p.short && p.bulk.Load() {
		time.Sleep(bulkPause)
	}
	n, err := p.r.Read(b)
	p.short = n < pauseBelow
	return n, err
}

// scrubbedError keeps the cause of a connection failure for errors.Is
// while its message holds no password.
type scrubbedError struct {
	msg string
	err error
}

func (e *scrubbedError) Error() string { return e.msg }
func (e *scrubbedError) Unwrap() error { return e.err }

// housekeep writes heartbeats and marks finished table reads done.
func (s *Source) housekeep(ctx context.Context, pool *pgxpool.Pool, markerDone <-chan pglogrepl.LSN) {
	t := time.NewTicker(s.cfg.HeartbeatInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case lsn := <-markerDone:
			if err := s.q.MarkTableRead(ctx, pool, s.slotName(), lsn.String()); err != nil && ctx.Err() == nil {
				s.log.Warn("marking the table read done failed; the next start checks the table again", "err", err)
			}
		case <-t.C:
			if err := s.q.Heartbeat(ctx, pool); err != nil && ctx.Err() == nil {
				s.log.Warn("writing the heartbeat failed", "err", err)
			}
		}
	}
}

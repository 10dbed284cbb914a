package cdc

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxrelay/relay/internal/jitter"
	"github.com/outboxrelay/relay/relay"
)

// receiveTimeout bounds one wait for a replication message, so that an
// acknowledgement reaches the server promptly even when the stream is
// quiet.
const receiveTimeout = 100 * time.Millisecond

// errSlotLost means the slot was dropped or invalidated.
var errSlotLost = errors.New("cdc: the replication slot is gone")

// permanentError is a failure that retrying cannot fix.
type permanentError struct{ err error }

func (e *permanentError) Error() string { return e.err.Error() }
func (e *permanentError) Unwrap() error { return e.err }

// reader is the background goroutine's state: it reads the table after a
// slot was (re)created, then streams, reconnecting until the source
// closes.
type reader struct {
	s    *Source
	pool *pgxpool.Pool
	// skipBelow is the position of the last event queued (Start's from at
	// first): anything at or before it is already delivered.
	skipBelow relay.Position
	// lastMajor is the commit LSN of the last transaction added to s.txs.
	lastMajor uint64
	// marker, when pending, is a slot creation whose table rows are still to
	// be queued.
	marker marker
	// table cursor (txid, id) of the table read in progress.
	tableTxid string
	tableID   int64

	decode *decoder
	rels   map[uint32]*relation
	// prefix is that of the emit_message messages of this outbox.
	prefix  string
	txMajor uint64
	txIndex uint64
	// txCommitted is the commit time of the transaction being received.
	txCommitted time.Time

	// streams are the streamed transactions not yet committed or aborted
	// in this session (streamtx.go), by top-level xid; cur is the one
	// whose chunk is arriving (between Stream Start and Stream Stop).
	streams map[uint32]*streamTx
	cur     *streamTx
	// streamMem is the memory the events in streams take.
	streamMem int64
	spillDir  string
	// noStream is set after a spill file failed: the reader reconnects
	// with protocol version 1, which needs no disk of its own.
	noStream bool
	loggedV1 bool
	// pace reads the current session's connection.
	pace *pacer
}

func (r *reader) run(ctx context.Context) {
	s := r.s
	var backoff time.Duration
	var busySince time.Time
	for ctx.Err() == nil {
		err := r.session(ctx, &backoff)
		if ctx.Err() != nil {
			return
		}
		backoff = min(max(2*backoff, 100*time.Millisecond), s.cfg.MaxBackoff)
		var perm *permanentError
		var spill *spillError
		switch {
		case errors.As(err, &spill):
			r.noStream = true
			s.spillFailures.Add(1)
			backoff = 0
			s.log.Error("a streamed transaction could not be spilled to disk; reconnecting with pgoutput protocol version 1, which leaves large transactions to the server until they commit, for as long as this source runs",
				"err", err, "spill_dir", r.spillDir)
		case errors.As(err, &perm):
			s.log.Error("the replication stream failed and cannot recover on its own", "err", err)
			s.fail(err)
			return
		case errors.Is(err, errSlotLost):
			busySince = time.Time{}
			if err := r.recoverSlot(ctx); err == nil {
				backoff = 0
				continue
			} else if errors.As(err, &perm) || errors.Is(err, ErrNoFreeSlot) {
				s.fail(err)
				return
			} else if ctx.Err() != nil {
				return
			} else {
				s.log.Error("recreating the replication slot failed; retrying", "err", err)
			}
		case errors.Is(err, ErrSlotActive):
			if busySince.IsZero() {
				busySince = time.Now()
			} else if time.Since(busySince) > s.cfg.SlotBusyTimeout {
				s.fail(err)
				return
			}
			s.log.Warn("the replication slot is still held by another process; retrying", "err", err)
		default:
			busySince = time.Time{}
			s.log.Warn("the replication stream stopped; reconnecting", "err", err, "retry_within", backoff)
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(jitter.Spread(backoff)):
		}
	}
}

// session reads the pending table rows, if any, then streams until an
// error. backoff is reset once streaming started.
func (r *reader) session(ctx context.Context, backoff *time.Duration) error {
	s := r.s
	if r.marker.pending() {
		if err := r.readTable(ctx); err != nil {
			return err
		}
	}
	pool := r.pool
	st, err := s.readSlot(ctx, pool, s.slotName())
	if err != nil {
		return err
	}
	if !st.exists || st.lost() {
		return errSlotLost
	}
	// A slot whose creation was not recorded whole (a re-creation that
	// failed half way) cannot say which rows to read from the table:
	// replace it rather than stream from it.
	if mk, err := s.readMarker(ctx, pool); err != nil {
		return err
	} else if !mk.exists || mk.creating() {
		return errSlotLost
	}
	if err := st.usable(s.slotName(), s.database); err != nil {
		if errors.Is(err, ErrSlotMismatch) {
			return &permanentError{err}
		}
		return err
	}
	r.pace = &pacer{}
	conn, err := s.connectReplication(ctx, r.pace)
	if err != nil {
		return err
	}
	defer func() {
		pid := int32(conn.PID())
		closeCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		conn.Close(closeCtx)
		if ctx.Err() != nil {
			s.awaitRelease(closeCtx, pool, s.slotName(), pid)
		}
	}()
	s.mu.Lock()
	s.flush = max(s.flush, st.confirmed)
	s.mu.Unlock()
	version := conn.ParameterStatus("server_version")
	streaming := !s.cfg.NoStreaming && !r.noStream && serverMajor(version) >= 14
	args := []string{
		"proto_version '1'",
		"publication_names '" + s.cfg.PublicationName + "'",
		"messages 'true'",
	}
	if streaming {
		args[0] = "proto_version '2'"
		args = append(args, "streaming 'on'")
	} else if !s.cfg.NoStreaming && !r.noStream && !r.loggedV1 {
		r.loggedV1 = true
		s.log.Warn("the server cannot stream transactions in progress (PostgreSQL 14 and later can): reading pgoutput protocol version 1, so the server holds each transaction until it commits",
			"server_version", version)
	}
	if !s.textTuples && binaryTuples(version) {
		args = append(args, "binary 'true'")
	}
	if r.spillDir == "" {
		id, err := pglogrepl.IdentifySystem(ctx, conn)
		if err != nil {
			return fmt.Errorf("cdc: identifying the server: %w", err)
		}
		r.spillDir = filepath.Join(os.TempDir(), "relay-cdc-spill-"+id.SystemID+"-"+s.slotName())
	}
	err = pglogrepl.StartReplication(ctx, conn, s.slotName(), 0, pglogrepl.StartReplicationOptions{
		Mode:       pglogrepl.LogicalReplication,
		PluginArgs: args,
	})
	if err != nil {
		if st, serr := s.readSlot(ctx, pool, s.slotName()); serr == nil && (!st.exists || st.lost()) {
			return errSlotLost
		}
		return fmt.Errorf("cdc: starting replication from slot %q: %w", s.slotName(), err)
	}
	*backoff = 0
	r.rels = map[uint32]*relation{}
	// The slot is this process's now: spill files in the directory are
	// an earlier session's or process's, whose transactions the server
	// sends again.
	defer func() {
		r.dropStreams()
		if s.cfg.SpillDir == "" {
			// The default directory goes when empty (a process killed
			// leaves it, and its files, to the next one).
			os.Remove(r.spillDir)
		}
	}()
	if n, err := removeSpills(r.spillDir); err != nil {
		s.log.Warn("removing earlier spill files failed", "err", err, "spill_dir", r.spillDir)
	} else if n > 0 {
		s.log.Info("removed spill files of an earlier run; the server sends their transactions again", "files", n, "spill_dir", r.spillDir)
	}
	s.log.Info("streaming from the replication slot", "after", r.skipBelow.String(), "streaming", streaming)
	return r.stream(ctx, conn)
}

// binaryTuples reports whether pgoutput can send values in binary format
// (PostgreSQL 14 and later): the walsender then skips the output functions
// (hex for bytea, date formatting for timestamps) of every type that has a
// send function, and sends bytea at half the size. Types without one still
// come as text, which the decoder reads too. serverVersion is the
// server_version the connection reported, say "15.18 (Debian ...)".
func binaryTuples(serverVersion string) bool { return serverMajor(serverVersion) >= 14 }

// serverMajor is the major version in a server_version, 0 when it has
// none.
func serverMajor(serverVersion string) int {
	end := 0
	for end < len(serverVersion) && isDigit(serverVersion[end]) {
		end++
	}
	major, err := strconv.Atoi(serverVersion[:end])
	if err != nil {
		return 0
	}
	return major
}

// awaitRelease waits until the walsender pid no longer holds the slot, so
// that a Start right after Close finds it free.
func (s *Source) awaitRelease(ctx context.Context, pool *pgxpool.Pool, slot string, pid int32) {
	for {
		st, err := s.readSlot(ctx, pool, slot)
		if err != nil || st.activePID != pid {
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// stream reads replication messages until an error, replying to the
// server's keepalives and reporting the flush position.
func (r *reader) stream(ctx context.Context, conn *pgconn.PgConn) error {
	s := r.s
	st := &statusSender{conn: conn, interval: s.cfg.StatusInterval}
	// Waits for messages are bounded by a read deadline on the socket,
	// renewed when it passes, rather than by a context per message: a
	// context makes pgconn watch it with a goroutine and reset the
	// deadline on every message, which cost more than decoding at
	// hundreds of thousands of messages a second. Messages already
	// buffered are read without touching the socket.
	netConn := conn.Conn()
	defer netConn.SetReadDeadline(time.Time{})
	wait := min(receiveTimeout, s.cfg.StatusInterval)
	var deadline time.Time
	for {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if err := r.waitForRoom(ctx, st); err != nil {
			return err
		}
		if err := st.send(ctx, s, false); err != nil {
			return err
		}
		if now := time.Now(); now.After(deadline) {
			deadline = now.Add(wait)
			if err := netConn.SetReadDeadline(deadline); err != nil {
				return fmt.Errorf("cdc: setting the replication stream's read deadline: %w", err)
			}
		}
		raw, err := conn.ReceiveMessage(context.Background())
		if err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			if pgconn.Timeout(err) && !conn.IsClosed() {
				deadline = time.Time{}
				continue
			}
			return fmt.Errorf("cdc: receiving from the replication stream: %w", err)
		}
		switch m := raw.(type) {
		case *pgproto3.CopyData:
			if len(m.Data) == 0 {
				continue
			}
			switch m.Data[0] {
			case pglogrepl.PrimaryKeepaliveMessageByteID:
				ka, err := pglogrepl.ParsePrimaryKeepaliveMessage(m.Data[1:])
				if err != nil {
					return fmt.Errorf("cdc: %w", err)
				}
				s.mu.Lock()
				s.serverEnd = max(s.serverEnd, ka.ServerWALEnd)
				s.advanceLocked()
				s.mu.Unlock()
				if ka.ReplyRequested {
					if err := st.send(ctx, s, true); err != nil {
						return err
					}
				}
			case pglogrepl.XLogDataByteID:
				xld, err := pglogrepl.ParseXLogData(m.Data[1:])
				if err != nil {
					return fmt.Errorf("cdc: %w", err)
				}
				if err := r.handle(ctx, st, xld.WALData); err != nil {
					return err
				}
			}
		case *pgproto3.ErrorResponse:
			return fmt.Errorf("cdc: replication stream: %w", pgconn.ErrorResponseToPgError(m))
		case *pgproto3.CopyDone:
			return errors.New("cdc: the server ended the replication stream")
		}
	}
}

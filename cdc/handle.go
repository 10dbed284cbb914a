package cdc

// The messages of a session: transactions sent whole and streamed
// (streamtx.go holds the latter until they end), and the inserts and
// logical messages in them, queued at their positions.

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pglogrepl"

	"github.com/outboxrelay/relay/relay"
)

// handle applies one pgoutput message.
func (r *reader) handle(ctx context.Context, st *statusSender, data []byte) error {
	s := r.s
	if r.cur != nil {
		return r.streamed(data)
	}
	if relID, ok := insertRelationID(data); ok {
		return r.insert(relID, data)
	}
	if len(data) == 0 {
		return &permanentError{errors.New("cdc: an empty pgoutput message")}
	}
	switch pglogrepl.MessageType(data[0]) {
	case pglogrepl.MessageTypeStreamStart, pglogrepl.MessageTypeStreamCommit, pglogrepl.MessageTypeStreamAbort:
		return r.streamControl(ctx, st, data)
	}
	msg, err := pglogrepl.Parse(data)
	if err != nil {
		return &permanentError{fmt.Errorf("cdc: decoding a pgoutput message: %w", err)}
	}
	switch m := msg.(type) {
	case *pglogrepl.RelationMessage:
		rel, err := newRelation(m, s.cfg.Schema)
		if err != nil {
			return &permanentError{err}
		}
		r.rels[m.RelationID] = rel
	case *pglogrepl.BeginMessage:
		r.begin(m.FinalLSN, m.CommitTime)
	case *pglogrepl.CommitMessage:
		r.commit(m.TransactionEndLSN)
	case *pglogrepl.LogicalDecodingMessage:
		if !m.Transactional {
			s.mu.Lock()
			s.serverEnd = max(s.serverEnd, m.LSN)
			s.advanceLocked()
			s.mu.Unlock()
			return nil
		}
		if m.Prefix == r.prefix {
			r.message(m)
		}
	}
	return nil
}

// begin starts a transaction whose commit record is at commitLSN.
func (r *reader) begin(commitLSN pglogrepl.LSN, committed time.Time) {
	r.txMajor, r.txIndex, r.txCommitted = uint64(commitLSN), 0, committed
	s := r.s
	s.mu.Lock()
	s.inTx = true
	s.mu.Unlock()
}

// commit ends the transaction begun, whose end LSN is end.
func (r *reader) commit(end pglogrepl.LSN) {
	r.pace.setBulk(false)
	s := r.s
	s.mu.Lock()
	if s.open != nil && s.open.major == r.txMajor {
		s.closeOpenLocked()
	}
	if r.txMajor > r.lastMajor {
		s.txs = append(s.txs, txMark{major: r.txMajor, last: r.txIndex - 1, empty: r.txIndex == 0, end: end})
		r.lastMajor = r.txMajor
	}
	s.inTx = false
	s.advanceLocked()
	s.notifyLocked()
	s.mu.Unlock()
}

// streamControl applies Stream Start, Stream Commit and Stream Abort,
// which arrive outside chunks.
func (r *reader) streamControl(ctx context.Context, st *statusSender, data []byte) error {
	msg, err := pglogrepl.ParseV2(data, false)
	if err != nil {
		return &permanentError{fmt.Errorf("cdc: decoding a pgoutput message: %w", err)}
	}
	switch m := msg.(type) {
	case *pglogrepl.StreamStartMessageV2:
		tx := r.streams[m.Xid]
		if tx != nil && m.FirstSegment == 1 {
			// The server starts the transaction over.
			r.dropStream(tx)
			tx = nil
		}
		if tx == nil {
			tx = &streamTx{xid: m.Xid, rels: map[uint32]*relation{}}
			r.streams[m.Xid] = tx
			r.s.mu.Lock()
			r.s.streamsOpen++
			r.s.mu.Unlock()
		}
		r.cur = tx
		r.pace.setBulk(true)
	case *pglogrepl.StreamAbortMessageV2:
		tx := r.streams[m.Xid]
		if tx == nil {
			return nil
		}
		if m.SubXid == m.Xid {
			r.dropStream(tx)
			return nil
		}
		freed, err := tx.abortSub(m.SubXid)
		r.streamMem -= freed
		return err
	case *pglogrepl.StreamCommitMessageV2:
		return r.streamCommit(ctx, st, m)
	}
	return nil
}

// streamed applies a message of a chunk: every one but Stream Stop
// carries the xid of the (sub)transaction whose change it is after its
// type byte.
func (r *reader) streamed(data []byte) error {
	tx := r.cur
	if data[0] == byte(pglogrepl.MessageTypeStreamStop) {
		r.cur = nil
		r.pace.setBulk(false)
		return nil
	}
	if len(data) < 5 {
		return &permanentError{fmt.Errorf("cdc: a streamed pgoutput message of %d bytes", len(data))}
	}
	tx.seen(binary.BigEndian.Uint32(data[1:5]))
	switch pglogrepl.MessageType(data[0]) {
	case pglogrepl.MessageTypeInsert:
		// Without the xid the message is a protocol 1 insert: the byte
		// before the relation id becomes the type byte.
		data[4] = data[0]
		relID, ok := insertRelationID(data[4:])
		if !ok {
			return &permanentError{errors.New("cdc: malformed streamed insert")}
		}
		rel := tx.rels[relID]
		if rel == nil {
			rel = r.rels[relID]
		}
		if rel == nil {
			return &permanentError{fmt.Errorf("cdc: insert into relation %d before its relation message", relID)}
		}
		if !rel.outbox {
			return nil
		}
		e, err := r.decode.insert(rel, data[4:])
		if err != nil {
			return &permanentError{err}
		}
		return r.keep(tx, e)
	case pglogrepl.MessageTypeRelation:
		msg, err := pglogrepl.ParseV2(data, true)
		if err != nil {
			return &permanentError{fmt.Errorf("cdc: decoding a pgoutput message: %w", err)}
		}
		m := msg.(*pglogrepl.RelationMessageV2)
		rel, err := newRelation(&m.RelationMessage, r.s.cfg.Schema)
		if err != nil {
			return &permanentError{err}
		}
		tx.rels[m.RelationID] = rel
	case pglogrepl.MessageTypeMessage:
		msg, err := pglogrepl.ParseV2(data, true)
		if err != nil {
			return &permanentError{fmt.Errorf("cdc: decoding a pgoutput message: %w", err)}
		}
		m := msg.(*pglogrepl.LogicalDecodingMessageV2)
		if m.Transactional && m.Prefix == r.prefix {
			return r.keep(tx, messageEvent(&m.LogicalDecodingMessage))
		}
	}
	return nil
}

// keep adds e to tx, spilling the largest open transactions while their
// events take more than the memory bound.
func (r *reader) keep(tx *streamTx, e relay.Event) error {
	r.streamMem += tx.add(e)
	bound := int64(r.s.cfg.StreamMemoryBytes)
	for r.streamMem > bound {
		var largest *streamTx
		for _, t := range r.streams {
			if largest == nil || t.memBytes > largest.memBytes {
				largest = t
			}
		}
		freed, err := largest.spill(r.spillDir)
		if err != nil {
			return err
		}
		r.streamMem -= freed
	}
	return nil
}

// streamCommit queues the events of a committed streamed transaction at
// their positions, as its BEGIN ... COMMIT would have, waiting for room
// in the queue on the way.
func (r *reader) streamCommit(ctx context.Context, st *statusSender, m *pglogrepl.StreamCommitMessageV2) error {
	tx := r.streams[m.Xid]
	if tx == nil {
		// Nothing of it was streamed in this session: it had no changes
		// the publication sends.
		tx = &streamTx{xid: m.Xid}
	}
	r.begin(m.CommitLSN, m.CommitTime)
	n := 0
	err := tx.each(func(e relay.Event) error {
		if n++; n%1024 == 0 {
			if err := st.send(ctx, r.s, false); err != nil {
				return err
			}
		}
		if err := r.waitForRoom(ctx, st); err != nil {
			return err
		}
		r.queueNext(e)
		return nil
	})
	if err != nil {
		return err
	}
	// pgoutput counts the relation messages of a committed streamed
	// transaction as sent to everything after it.
	for id, rel := range tx.rels {
		r.rels[id] = rel
	}
	if r.streams[m.Xid] != nil {
		r.dropStream(tx)
	}
	r.commit(m.TransactionEndLSN)
	return nil
}

// queueNext queues an event at the next position of the current
// transaction, if not delivered yet: an event of a committed streamed
// transaction, or a logical message.
func (r *reader) queueNext(e relay.Event) {
	if pos, ok := r.nextPosition(); ok {
		r.queueAt(e, pos)
	}
}

// nextPosition takes the next position of the current transaction and
// reports whether an event there is still to deliver (it is past what the
// core already has).
func (r *reader) nextPosition() (relay.Position, bool) {
	pos := relay.Position{Major: r.txMajor, Minor: r.txIndex}
	r.txIndex++
	if r.txIndex == bulkAfter {
		r.pace.setBulk(true)
	}
	return pos, r.skipBelow.Less(pos)
}

// queueAt queues e at pos, the position nextPosition gave it. An event
// without a row of its own is dated by the commit.
func (r *reader) queueAt(e relay.Event, pos relay.Position) {
	if e.CreatedAt.IsZero() && !e.HasRow() {
		e.CreatedAt = r.txCommitted
	}
	e.Position = pos
	e.CommittedAt = r.txCommitted
	s := r.s
	s.mu.Lock()
	s.pushLocked(e)
	s.mu.Unlock()
	r.skipBelow = pos
}

// dropStream forgets a streamed transaction and removes its spill file.
func (r *reader) dropStream(tx *streamTx) {
	r.streamMem -= tx.memBytes
	tx.close()
	delete(r.streams, tx.xid)
	if r.cur == tx {
		r.cur = nil
	}
	s := r.s
	s.mu.Lock()
	s.streamsOpen--
	s.advanceLocked()
	s.mu.Unlock()
}

// dropStreams forgets every streamed transaction of the session: the
// next session receives them again.
func (r *reader) dropStreams() {
	for _, tx := range r.streams {
		r.dropStream(tx)
	}
	r.streams, r.cur, r.streamMem = map[uint32]*streamTx{}, nil, 0
}

// message queues the event of an emit_message message (message.go), if
// not delivered yet. It takes the next position of its transaction, as an
// insert does, so messages and inserts keep their order.
func (r *reader) message(m *pglogrepl.LogicalDecodingMessage) {
	r.queueNext(messageEvent(m))
}

// insert queues the event of an Insert message, if it is an insert into
// the outbox not delivered yet.
func (r *reader) insert(relID uint32, data []byte) error {
	rel, ok := r.rels[relID]
	if !ok {
		return &permanentError{fmt.Errorf("cdc: insert into relation %d before its relation message", relID)}
	}
	if !rel.outbox {
		return nil
	}
	pos, ok := r.nextPosition()
	if !ok {
		return nil
	}
	e, err := r.decode.insert(rel, data)
	if err != nil {
		return &permanentError{err}
	}
	r.queueAt(e, pos)
	return nil
}

package cdc

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/outboxrelay/relay/relay"
)

// Streamed transactions (pgoutput protocol version 2, "streaming on"): the
// server sends a large transaction in chunks while it runs, each between
// Stream Start and Stream Stop and each change tagged with the xid of the
// (sub)transaction that made it, and ends it with Stream Commit or Stream
// Abort. The reader decodes the outbox events of each chunk as they
// arrive and keeps them, per top-level xid, in a streamTx until the
// transaction ends: at Stream Commit they are queued at their positions
// exactly as a transaction sent whole would have been; at Stream Abort
// they are dropped. Events live in memory up to Config.StreamMemoryBytes
// for all open streamed transactions together, and in one spill file per
// transaction beyond.

// streamTx is an open streamed transaction's events, in the order
// received: the first fileEvents in the spill file, the rest in mem.
type streamTx struct {
	xid uint32
	// rels are the relation messages of this transaction: pgoutput sends
	// a streamed transaction its own (and a transaction sent whole does
	// not see them).
	rels map[uint32]*relation
	mem  []relay.Event
	// memBytes is what mem counts against the memory bound.
	memBytes   int64
	path       string
	file       *os.File
	w          *bufio.Writer
	fileEvents int
	fileBytes  int64
	// subs are the subtransactions seen, in order of their first
	// message, each with the number of events before it.
	subs []subStart
}

// subStart is where a subtransaction's changes begin among its top-level
// transaction's events: everything from there to its abort is its own or
// its children's (subtransactions nest), so its abort cuts the events
// back to there, as PostgreSQL's own apply worker does.
type subStart struct {
	xid   uint32
	index int
	// offset is where event index starts in the spill file, once written.
	offset int64
}

// events is the number of events kept.
func (t *streamTx) events() int { return t.fileEvents + len(t.mem) }

// seen records the first message of subtransaction xid.
func (t *streamTx) seen(xid uint32) {
	if xid == t.xid {
		return
	}
	for i := len(t.subs) - 1; i >= 0; i-- {
		if t.subs[i].xid == xid {
			return
		}
	}
	t.subs = append(t.subs, subStart{xid: xid, index: t.events(), offset: -1})
}

// memCost is what an event held in memory counts against the bound: its
// bytes, the struct (184 bytes) and its share of the slice's spare
// capacity, and the rounding of its allocations.
func memCost(e relay.Event) int64 { return eventBytes(e) + int64(len(e.EventID)+len(e.Topic)) + 320 }

// add keeps e, returning the memory it takes.
func (t *streamTx) add(e relay.Event) int64 {
	t.mem = append(t.mem, e)
	c := memCost(e)
	t.memBytes += c
	return c
}

// spill writes the events in memory to the spill file in dir, returning
// the memory freed.
func (t *streamTx) spill(dir string) (int64, error) {
	if len(t.mem) == 0 {
		return 0, nil
	}
	if t.file == nil {
		if err := os.MkdirAll(dir, 0o700); err != nil {
			return 0, &spillError{err}
		}
		t.path = filepath.Join(dir, spillName(t.xid))
		f, err := os.OpenFile(t.path, os.O_RDWR|os.O_CREATE|os.O_TRUNC, 0o600)
		if err != nil {
			return 0, &spillError{err}
		}
		t.file, t.w = f, bufio.NewWriterSize(f, 256<<10)
	}
	var buf []byte
	for i, e := range t.mem {
		index := t.fileEvents + i
		for j := len(t.subs) - 1; j >= 0 && t.subs[j].index >= index; j-- {
			if t.subs[j].index == index {
				t.subs[j].offset = t.fileBytes
			}
		}
		buf = appendEvent(buf[:0], e)
		if _, err := t.w.Write(buf); err != nil {
			return 0, &spillError{err}
		}
		t.fileBytes += int64(len(buf))
	}
	if err := t.w.Flush(); err != nil {
		return 0, &spillError{err}
	}
	freed := t.memBytes
	t.fileEvents += len(t.mem)
	// The array goes too: kept, it would hold memory the bound does not
	// count.
	t.mem, t.memBytes = nil, 0
	return freed, nil
}

// abortSub drops the events of subtransaction xid and of those that began
// after it, returning the memory freed. An xid never seen had no events.
func (t *streamTx) abortSub(xid uint32) (int64, error) {
	at := -1
	for i := len(t.subs) - 1; i >= 0; i-- {
		if t.subs[i].xid == xid {
			at = i
			break
		}
	}
	if at < 0 {
		return 0, nil
	}
	sub := t.subs[at]
	kept := t.subs[:0]
	for i, s := range t.subs {
		if i != at && s.index <= sub.index {
			kept = append(kept, s)
		}
	}
	t.subs = kept
	var freed int64
	if sub.index >= t.fileEvents {
		for _, e := range t.mem[sub.index-t.fileEvents:] {
			freed += memCost(e)
		}
		clear(t.mem[sub.index-t.fileEvents:])
		t.mem = t.mem[:sub.index-t.fileEvents]
		t.memBytes -= freed
		return freed, nil
	}
	// The cut is in the file: everything in memory came after it.
	if err := t.file.Truncate(sub.offset); err != nil {
		return 0, &spillError{err}
	}
	if _, err := t.file.Seek(sub.offset, io.SeekStart); err != nil {
		return 0, &spillError{err}
	}
	t.w.Reset(t.file)
	t.fileEvents, t.fileBytes = sub.index, sub.offset
	freed = t.memBytes
	t.mem, t.memBytes = nil, 0
	return freed, nil
}

// each calls fn with every event in order, reading the spill file back.
func (t *streamTx) each(fn func(relay.Event) error) error {
	if t.file != nil {
		if _, err := t.file.Seek(0, io.SeekStart); err != nil {
			return &spillError{err}
		}
		rd := bufio.NewReaderSize(io.LimitReader(t.file, t.fileBytes), 256<<10)
		for range t.fileEvents {
			e, err := readEvent(rd)
			if err != nil {
				return &spillError{fmt.Errorf("reading back %s: %w", t.path, err)}
			}
			if err := fn(e); err != nil {
				return err
			}
		}
	}
	for _, e := range t.mem {
		if err := fn(e); err != nil {
			return err
		}
	}
	return nil
}

// close removes the spill file.
func (t *streamTx) close() {
	if t.file != nil {
		t.file.Close()
		os.Remove(t.path)
		t.file, t.w = nil, nil
	}
	t.mem = nil
}

// spillError is a failure to write or read a spill file: disk full, the
// directory unusable. The reader then reconnects without streaming.
type spillError struct{ err error }

func (e *spillError) Error() string { return "cdc: spilling a streamed transaction: " + e.err.Error() }
func (e *spillError) Unwrap() error { return e.err }

const spillSuffix = ".stream"

func spillName(xid uint32) string { return "xid-" + strconv.FormatUint(uint64(xid), 10) + spillSuffix }

// removeSpills removes the spill files of an earlier session or process
// from dir: the server sends their transactions again from the slot's
// restart point, so they are garbage, whole or torn.
func removeSpills(dir string) (int, error) {
	entries, err := os.ReadDir(dir)
	if errors.Is(err, os.ErrNotExist) {
		return 0, nil
	}
	if err != nil {
		return 0, err
	}
	n := 0
	for _, de := range entries {
		if de.Type().IsRegular() && strings.HasPrefix(de.Name(), "xid-") && strings.HasSuffix(de.Name(), spillSuffix) {
			if err := os.Remove(filepath.Join(dir, de.Name())); err != nil {
				return n, err
			}
			n++
		}
	}
	return n, nil
}

// A spilled event is its length (uvarint), then ID and TooLarge
// (varints), the creation time (length-prefixed time.MarshalBinary, which
// keeps the offset), the event id and topic (length-prefixed), and key,
// payload and headers, each as length+1 with 0 for nil. Position and
// commit time are set when the transaction commits.

func appendEvent(buf []byte, e relay.Event) []byte {
	body := make([]byte, 0, 64+len(e.EventID)+len(e.Topic)+len(e.Key)+len(e.Payload)+len(e.Headers))
	body = binary.AppendVarint(body, e.ID)
	body = binary.AppendVarint(body, e.TooLarge)
	created, _ := e.CreatedAt.MarshalBinary()
	body = appendBytes(body, created)
	body = appendBytes(body, []byte(e.EventID))
	body = appendBytes(body, []byte(e.Topic))
	body = appendNullable(body, e.Key)
	body = appendNullable(body, e.Payload)
	body = appendNullable(body, e.Headers)
	buf = binary.AppendUvarint(buf, uint64(len(body)))
	return append(buf, body...)
}

func appendBytes(b, v []byte) []byte {
	b = binary.AppendUvarint(b, uint64(len(v)))
	return append(b, v...)
}

func appendNullable(b, v []byte) []byte {
	if v == nil {
		return binary.AppendUvarint(b, 0)
	}
	b = binary.AppendUvarint(b, uint64(len(v))+1)
	return append(b, v...)
}

var errTornEvent = errors.New("a spilled event is cut short")

func readEvent(rd *bufio.Reader) (relay.Event, error) {
	var e relay.Event
	n, err := binary.ReadUvarint(rd)
	if err != nil {
		return e, err
	}
	body := make([]byte, n)
	if _, err := io.ReadFull(rd, body); err != nil {
		return e, err
	}
	p := eventReader{b: body}
	e.ID = p.varint()
	e.TooLarge = p.varint()
	created := p.bytes()
	e.EventID = string(p.bytes())
	e.Topic = string(p.bytes())
	e.Key = p.nullable()
	e.Payload = p.nullable()
	e.Headers = p.nullable()
	if p.bad || len(p.b) != 0 {
		return e, errTornEvent
	}
	if err := e.CreatedAt.UnmarshalBinary(created); err != nil {
		return e, err
	}
	return e, nil
}

// eventReader reads a spilled event's fields; the returned slices share
// the event's one allocation.
type eventReader struct {
	b   []byte
	bad bool
}

func (p *eventReader) varint() int64 {
	v, n := binary.Varint(p.b)
	if n <= 0 {
		p.bad = true
		return 0
	}
	p.b = p.b[n:]
	return v
}

func (p *eventReader) take(n uint64) []byte {
	if n > uint64(len(p.b)) {
		p.bad = true
		return nil
	}
	v := p.b[:n:n]
	p.b = p.b[n:]
	return v
}

// length reads a uvarint length prefix; ok is false, and p bad, when
// there is none.
func (p *eventReader) length() (n uint64, ok bool) {
	n, k := binary.Uvarint(p.b)
	if k <= 0 {
		p.bad = true
		return 0, false
	}
	p.b = p.b[k:]
	return n, true
}

func (p *eventReader) bytes() []byte {
	n, ok := p.length()
	if !ok {
		return nil
	}
	return p.take(n)
}

func (p *eventReader) nullable() []byte {
	n, ok := p.length()
	if !ok || n == 0 {
		return nil
	}
	return p.take(n - 1)
}

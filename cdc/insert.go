package cdc

import (
	"encoding/binary"
	"errors"
	"fmt"
	"unsafe"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/outboxrelay/relay/relay"
)

// The fast path for pgoutput Insert messages, which are almost all of what
// the reader receives. An Insert is
//
//	'I', relation id (uint32), 'N', column count (uint16), then per column
//	a kind byte: 'n' NULL, 'u' unchanged TOASTed value (never in an
//	insert), 't' text or 'b' binary, the last two followed by the value's
//	length (uint32) and bytes,
//
// all integers big-endian (PostgreSQL's "Logical Replication Message
// Formats"). insert walks it once, keeping slices of the receive buffer
// for the seven columns the relay reads, parses them with the strict
// parsers of values.go, and copies every byte the event keeps into one
// allocation. Where a value is in a form those parsers leave alone
// (errUnusual), or a column type is not the migrations' (relation.fast),
// the message goes through pglogrepl and pgtype instead, as all of them
// did before. What decoded before still decodes to the same event
// (FuzzInsert checks it), except on purpose: a created_at before year 1
// (BC) and a uuid not in its canonical text form, which uuid_out never
// prints, are errors now.

// Kinds of tuple columns.
const (
	kindNull      = 'n'
	kindUnchanged = 'u'
	kindText      = 't'
	kindBinary    = 'b'
)

// insertRelationID returns the relation of an Insert message, false for
// any other message.
func insertRelationID(msg []byte) (uint32, bool) {
	if len(msg) < 5 || msg[0] != byte(pglogrepl.MessageTypeInsert) {
		return 0, false
	}
	return binary.BigEndian.Uint32(msg[1:5]), true
}

// rawColumn is one column of a tuple: its kind and its bytes, which belong
// to the receive buffer.
type rawColumn struct {
	kind byte
	data []byte
}

// insert decodes an Insert message of the outbox relation r.
func (d *decoder) insert(r *relation, msg []byte) (relay.Event, error) {
	var cols [numFields]rawColumn
	if err := r.split(msg, &cols); err != nil {
		return relay.Event{}, err
	}
	if r.fast {
		e, err := r.fastEvent(&cols)
		if !errors.Is(err, errUnusual) {
			return e, err
		}
	}
	// split checked the framing, so pglogrepl, which does not check
	// bounds, cannot panic on it.
	m, err := pglogrepl.Parse(msg)
	if err != nil {
		return relay.Event{}, fmt.Errorf("cdc: decoding an insert: %w", err)
	}
	ins, ok := m.(*pglogrepl.InsertMessage)
	if !ok {
		return relay.Event{}, fmt.Errorf("cdc: decoding an insert: pglogrepl read a %T", m)
	}
	return d.event(r, ins.Tuple)
}

// split checks an Insert message's framing and sets cols to the columns
// of the relay's fields.
func (r *relation) split(msg []byte, cols *[numFields]rawColumn) error {
	if len(msg) < 8 || msg[5] != 'N' {
		return errors.New("cdc: malformed insert message: no new tuple")
	}
	if n := int(binary.BigEndian.Uint16(msg[6:8])); n != len(r.field) {
		return fmt.Errorf("cdc: insert tuple has %d columns, the relation has %d", n, len(r.field))
	}
	p := 8
	for i, f := range r.field {
		if p >= len(msg) {
			return fmt.Errorf("cdc: malformed insert message: it ends before column %s", r.names[i])
		}
		c := rawColumn{kind: msg[p]}
		p++
		switch c.kind {
		case kindNull, kindUnchanged:
		case kindText, kindBinary:
			if len(msg)-p < 4 {
				return fmt.Errorf("cdc: malformed insert message: it ends in the length of column %s", r.names[i])
			}
			n := binary.BigEndian.Uint32(msg[p:])
			p += 4
			if uint64(n) > uint64(len(msg)-p) {
				return fmt.Errorf("cdc: malformed insert message: column %s has %d bytes, %d remain", r.names[i], n, len(msg)-p)
			}
			c.data = msg[p : p+int(n)]
			p += int(n)
		default:
			return fmt.Errorf("cdc: malformed insert message: column %s has kind %q", r.names[i], c.kind)
		}
		if f >= 0 {
			cols[f] = c
		}
	}
	if p != len(msg) {
		return fmt.Errorf("cdc: malformed insert message: %d bytes after the last column", len(msg)-p)
	}
	return nil
}

// parseColumn parses c with the parser for its format, text or binary.
func parseColumn[T any](c *rawColumn, text, binary func([]byte) (T, error)) (T, error) {
	if c.kind == kindText {
		return text(c.data)
	}
	return binary(c.data)
}

// fastEvent decodes the columns split found. The event's strings and
// slices share one allocation: its event id and topic as strings, and its
// key, payload and headers as slices capped at their ends, so an append to
// one cannot write over the next. The bytes behind the strings are never
// reachable as a slice, so the strings are immutable.
func (r *relation) fastEvent(cols *[numFields]rawColumn) (relay.Event, error) {
	var e relay.Event
	for f, c := range cols {
		// A NULL where the table says NOT NULL, or an unchanged-TOAST
		// marker, is the reference decoder's to report as it always has.
		if c.kind == kindUnchanged || c.kind == kindNull && f != fieldKey && f != fieldPayload && f != fieldHeaders {
			return e, errUnusual
		}
	}
	var err error
	if e.ID, err = parseColumn(&cols[fieldID], parseInt8Text, parseInt8Binary); err != nil {
		return e, r.fieldError(fieldID, err)
	}
	if e.CreatedAt, err = parseColumn(&cols[fieldCreatedAt], parseTimestamptzText, parseTimestamptzBinary); err != nil {
		return e, r.fieldError(fieldCreatedAt, err)
	}

	topic, key := cols[fieldTopic].data, &cols[fieldKey]
	payload, headers := &cols[fieldPayload], &cols[fieldHeaders]
	payloadLen := len(payload.data)
	if payload.kind == kindText {
		if payloadLen, err = hexByteaLen(payload.data); err != nil {
			return e, r.fieldError(fieldPayload, err)
		}
	}
	headerBytes := headers.data
	if headers.kind == kindBinary && r.oids[r.at[fieldHeaders]] == pgtype.JSONBOID {
		if len(headerBytes) == 0 || headerBytes[0] != jsonbBinaryVersion {
			return e, errors.New("cdc: headers column: unknown binary jsonb version")
		}
		headerBytes = headerBytes[1:]
	}

	buf := make([]byte, 0, uuidTextLen+len(topic)+len(key.data)+payloadLen+len(headerBytes))
	eventID := &cols[fieldEventID]
	if eventID.kind == kindText {
		buf, err = appendUUIDText(buf, eventID.data)
	} else {
		buf, err = appendUUIDBinary(buf, eventID.data)
	}
	if err != nil {
		return e, r.fieldError(fieldEventID, err)
	}
	e.EventID = unsafe.String(&buf[0], uuidTextLen)
	if len(topic) > 0 {
		buf = append(buf, topic...)
		e.Topic = unsafe.String(&buf[uuidTextLen], len(topic))
	}
	if key.kind != kindNull {
		start := len(buf)
		buf = append(buf, key.data...)
		e.Key = buf[start:len(buf):len(buf)]
	}
	if payload.kind != kindNull {
		start := len(buf)
		if payload.kind == kindText {
			if buf, err = appendHexBytea(buf, payload.data); err != nil {
				return relay.Event{}, r.fieldError(fieldPayload, err)
			}
		} else {
			buf = append(buf, payload.data...)
		}
		e.Payload = buf[start:len(buf):len(buf)]
	}
	if headers.kind != kindNull {
		start := len(buf)
		buf = append(buf, headerBytes...)
		e.Headers = buf[start:len(buf):len(buf)]
	}
	return e, nil
}

func (r *relation) fieldError(f int, err error) error {
	if errors.Is(err, errUnusual) {
		return err
	}
	return fmt.Errorf("cdc: decoding column %s of an outbox insert: %w", r.names[r.at[f]], err)
}

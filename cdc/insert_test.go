package cdc

import (
	"bytes"
	"encoding/binary"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/outboxrelay/relay/relay"
)

// xid8OID is the type of the outbox's txid column, which the relay skips.
const xid8OID = 5069

// outboxRelationMessage is the relation message of the migrations' outbox
// table, columns in their order.
func outboxRelationMessage() *pglogrepl.RelationMessage {
	return &pglogrepl.RelationMessage{RelationID: 16385, Namespace: "outbox", RelationName: "events", Columns: []*pglogrepl.RelationMessageColumn{
		{Name: "id", DataType: pgtype.Int8OID},
		{Name: "txid", DataType: xid8OID},
		{Name: "event_id", DataType: pgtype.UUIDOID},
		{Name: "topic", DataType: pgtype.TextOID},
		{Name: "key", DataType: pgtype.TextOID},
		{Name: "payload", DataType: pgtype.ByteaOID},
		{Name: "headers", DataType: pgtype.JSONBOID},
		{Name: "created_at", DataType: pgtype.TimestamptzOID},
	}}
}

// insertMessage encodes an Insert message of relation relID with the
// tuple td, as pgoutput does.
func insertMessage(relID uint32, td *pglogrepl.TupleData) []byte {
	msg := []byte{'I'}
	msg = binary.BigEndian.AppendUint32(msg, relID)
	msg = append(msg, 'N')
	msg = binary.BigEndian.AppendUint16(msg, uint16(len(td.Columns)))
	for _, c := range td.Columns {
		msg = append(msg, c.DataType)
		if c.DataType == pglogrepl.TupleDataTypeText || c.DataType == pglogrepl.TupleDataTypeBinary {
			msg = binary.BigEndian.AppendUint32(msg, uint32(len(c.Data)))
			msg = append(msg, c.Data...)
		}
	}
	return msg
}

// textTuple builds a text-format tuple of the outbox relation from values
// in its column order; a nil value is NULL.
func textTuple(values ...any) *pglogrepl.TupleData {
	td := &pglogrepl.TupleData{ColumnNum: uint16(len(values))}
	for _, v := range values {
		switch v := v.(type) {
		case nil:
			td.Columns = append(td.Columns, &pglogrepl.TupleDataColumn{DataType: pglogrepl.TupleDataTypeNull})
		case string:
			td.Columns = append(td.Columns, &pglogrepl.TupleDataColumn{DataType: pglogrepl.TupleDataTypeText, Length: uint32(len(v)), Data: []byte(v)})
		}
	}
	return td
}

// sampleValues is a typical insert of the relay bench, in text format.
func sampleValues() []any {
	return []any{"123456", "7890", "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11", "orders", "key-4711",
		`\x` + strings.Repeat("78", 200), `{"trace-id": "abc"}`, "2026-12-01 04:26:57.098123+00"}
}

// sameEvent reports whether two decoded events are the same, nil-ness of
// slices and the time's location included.
func sameEvent(a, b relay.Event) bool {
	sameBytes := func(x, y []byte) bool { return (x == nil) == (y == nil) && bytes.Equal(x, y) }
	return a.ID == b.ID && a.EventID == b.EventID && a.Topic == b.Topic &&
		sameBytes(a.Key, b.Key) && sameBytes(a.Payload, b.Payload) && sameBytes(a.Headers, b.Headers) &&
		a.CreatedAt.Equal(b.CreatedAt) && a.CreatedAt.Location() == b.CreatedAt.Location()
}

func outboxRelation(t testing.TB) *relation {
	t.Helper()
	r, err := newRelation(outboxRelationMessage(), "outbox")
	if err != nil || !r.outbox || !r.fast {
		t.Fatalf("newRelation = %+v, %v", r, err)
	}
	return r
}

func TestInsertFastPathMatchesPgtype(t *testing.T) {
	r := outboxRelation(t)
	d := newDecoder()
	for name, values := range map[string][]any{
		"typical":        sampleValues(),
		"nulls":          {"1", "2", "00000000-0000-0000-0000-000000000000", "t", nil, nil, nil, "2026-12-01 04:26:57+00"},
		"empty":          {"-9223372036854775808", "2", "A0EEBC99-9C0B-4EF8-BB6D-6BB9BD380A11", "", "", `\x`, "{}", "1999-12-31 23:59:59.5-03:30"},
		"offset seconds": {"9223372036854775807", "3", "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11", "x", "k", `\x00FF`, "[]", "1880-01-01 00:00:00+00:53:28"},
	} {
		td := textTuple(values...)
		msg := insertMessage(1, td)
		var cols [numFields]rawColumn
		if err := r.split(msg, &cols); err != nil {
			t.Fatalf("%s: split: %v", name, err)
		}
		fast, err := r.fastEvent(&cols)
		if err != nil {
			t.Fatalf("%s: fast path: %v", name, err)
		}
		ref, err := d.event(r, td)
		if err != nil {
			t.Fatalf("%s: pgtype path: %v", name, err)
		}
		if !sameEvent(fast, ref) {
			t.Fatalf("%s: fast path %+v, pgtype path %+v", name, fast, ref)
		}
		// The event must not share memory with the receive buffer.
		clear(msg)
		if !sameEvent(fast, ref) {
			t.Fatalf("%s: the event changed with the receive buffer: %+v", name, fast)
		}
	}
}

func TestInsertEventSlicesDoNotOverlap(t *testing.T) {
	r := outboxRelation(t)
	e, err := newDecoder().insert(r, insertMessage(1, textTuple(sampleValues()...)))
	if err != nil {
		t.Fatal(err)
	}
	payload := string(e.Payload)
	e.Key = append(e.Key, "overwrite"...)
	e.Payload = append(e.Payload, "overwrite"...)
	if string(e.Payload[:len(payload)]) != payload || string(e.Headers) != `{"trace-id": "abc"}` || e.Topic != "orders" {
		t.Fatalf("appending to one slice of the event changed another: %+v", e)
	}
}

func TestInsertBinaryFormat(t *testing.T) {
	r := outboxRelation(t)
	created := time.Date(2026, 12, 1, 4, 26, 57, 98123000, time.UTC)
	usec := created.Sub(time.Date(2000, 1, 1, 0, 0, 0, 0, time.UTC)).Microseconds()
	col := func(b []byte) *pglogrepl.TupleDataColumn {
		return &pglogrepl.TupleDataColumn{DataType: pglogrepl.TupleDataTypeBinary, Length: uint32(len(b)), Data: b}
	}
	td := &pglogrepl.TupleData{ColumnNum: 8, Columns: []*pglogrepl.TupleDataColumn{
		col(binary.BigEndian.AppendUint64(nil, 42)),
		col(binary.BigEndian.AppendUint64(nil, 7)),
		col([]byte{0xa0, 0xee, 0xbc, 0x99, 0x9c, 0x0b, 0x4e, 0xf8, 0xbb, 0x6d, 0x6b, 0xb9, 0xbd, 0x38, 0x0a, 0x11}),
		col([]byte("orders")),
		col([]byte("k")),
		col([]byte{0, 1, 0xff}),
		col([]byte("\x01{\"a\": \"b\"}")),
		col(binary.BigEndian.AppendUint64(nil, uint64(usec))),
	}}
	d := newDecoder()
	e, err := d.insert(r, insertMessage(1, td))
	if err != nil {
		t.Fatal(err)
	}
	ref, err := d.event(r, td)
	if err != nil {
		t.Fatal(err)
	}
	if !sameEvent(e, ref) || e.ID != 42 || e.EventID != "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11" || !e.CreatedAt.Equal(created) ||
		string(e.Headers) != `{"a": "b"}` || !bytes.Equal(e.Payload, []byte{0, 1, 0xff}) {
		t.Fatalf("binary insert decoded as %+v, pgtype says %+v", e, ref)
	}
	td.Columns[6] = col([]byte("\x02{}"))
	if _, err := d.insert(r, insertMessage(1, td)); err == nil || !strings.Contains(err.Error(), "jsonb version") {
		t.Fatalf("jsonb version 2: %v", err)
	}
}

// TestInsertMalformedValue: a value the column's type cannot hold fails
// with an error that names the column.
func TestInsertMalformedValue(t *testing.T) {
	r := outboxRelation(t)
	d := newDecoder()
	for _, tc := range []struct {
		column int
		value  any
		want   string
	}{
		{0, "12x", "column id"},
		{2, "not-a-uuid", "column event_id"},
		{2, "a0eebc99+9c0b-4ef8-bb6d-6bb9bd380a11", "column event_id"},
		{5, `\x7`, "column payload"},
		{5, `\xzz`, "column payload"},
		{7, "2026-02-30 00:00:00+00", "column created_at"},
		{7, "infinity", "column created_at of an outbox insert: infinite timestamps are not supported"},
		{7, "2026-12-01 04:26:57+00 BC", "column created_at of an outbox insert: timestamps before year 1 (BC) are not supported"},
	} {
		values := sampleValues()
		values[tc.column] = tc.value
		_, err := d.insert(r, insertMessage(1, textTuple(values...)))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v in column %d: error %v, want one with %q", tc.value, tc.column, err, tc.want)
		}
	}
}

// TestInsertUnusualGoesThroughPgtype: values in a form the fast parsers
// leave alone, and columns of other types than the migrations', decode as
// they did before.
func TestInsertUnusualGoesThroughPgtype(t *testing.T) {
	r := outboxRelation(t)
	d := newDecoder()
	values := sampleValues()
	values[7] = "10000-01-01 00:00:00.12345678+00"
	e, err := d.insert(r, insertMessage(1, textTuple(values...)))
	if want := time.Date(10000, 1, 1, 0, 0, 0, 123457000, time.UTC); err != nil || !e.CreatedAt.Equal(want) {
		t.Errorf("year 10000 with 8 fraction digits: %v, %v", e.CreatedAt, err)
	}
	// pgtype never read the escape format; nor does the relay now.
	values = sampleValues()
	values[5] = `abc\000`
	if _, err := d.insert(r, insertMessage(1, textTuple(values...))); err == nil || !strings.Contains(err.Error(), "column payload") {
		t.Errorf("escape-format bytea: %v", err)
	}
	// A NULL id, which the table forbids, decodes as pgtype did.
	values = sampleValues()
	values[0] = nil
	if e, err := d.insert(r, insertMessage(1, textTuple(values...))); err != nil || e.ID != 0 {
		t.Errorf("NULL id: %+v, %v", e, err)
	}
	// An unchanged-TOAST marker is an error, from pgtype as before.
	td := textTuple(sampleValues()...)
	td.Columns[5] = &pglogrepl.TupleDataColumn{DataType: pglogrepl.TupleDataTypeToast}
	if _, err := d.insert(r, insertMessage(1, td)); err == nil || !strings.Contains(err.Error(), "payload") {
		t.Errorf("unchanged TOAST payload: %v", err)
	}
	// A relation whose id is an int4 and key a char(n) is not the fast
	// path's.
	rm := outboxRelationMessage()
	rm.Columns[0].DataType = pgtype.Int4OID
	rm.Columns[4].DataType = pgtype.BPCharOID
	slow, err := newRelation(rm, "outbox")
	if err != nil || slow.fast {
		t.Fatalf("int4 id: %+v, %v", slow, err)
	}
	values = sampleValues()
	values[0] = "77"
	if e, err := d.insert(slow, insertMessage(1, textTuple(values...))); err != nil || e.ID != 77 || string(e.Key) != "key-4711" {
		t.Errorf("int4 id: %+v, %v", e, err)
	}
}

// TestInsertFraming: every truncation of a message, and bytes after its
// end, are errors, never a panic or a wrong event.
func TestInsertFraming(t *testing.T) {
	r := outboxRelation(t)
	d := newDecoder()
	msg := insertMessage(1, textTuple(sampleValues()...))
	for n := 5; n < len(msg); n++ {
		if _, err := d.insert(r, msg[:n]); err == nil || !strings.Contains(err.Error(), "malformed insert") {
			t.Fatalf("truncated to %d of %d bytes: %v", n, len(msg), err)
		}
	}
	if _, err := d.insert(r, append(msg, 0)); err == nil || !strings.Contains(err.Error(), "after the last column") {
		t.Fatalf("a trailing byte: %v", err)
	}
	bad := bytes.Clone(msg)
	bad[8] = 'x'
	if _, err := d.insert(r, bad); err == nil || !strings.Contains(err.Error(), `column id has kind 'x'`) {
		t.Fatalf("unknown kind: %v", err)
	}
	seven := insertMessage(1, textTuple(sampleValues()[:7]...))
	if _, err := d.insert(r, seven); err == nil || !strings.Contains(err.Error(), "7 columns, the relation has 8") {
		t.Fatalf("7 columns: %v", err)
	}
}

func TestBinaryTuplesFromPostgreSQL14(t *testing.T) {
	for v, want := range map[string]bool{
		"15.18 (Debian 15.18-0+deb12u1)": true,
		"14.0":                           true,
		"17beta1":                        true,
		"13.16":                          false,
		"9.6.24":                         false,
		"":                               false,
	} {
		if got := binaryTuples(v); got != want {
			t.Errorf("binaryTuples(%q) = %v", v, got)
		}
	}
}

// binaryTuple is sampleValues in binary format.
func binaryTuple() *pglogrepl.TupleData {
	col := func(b []byte) *pglogrepl.TupleDataColumn {
		return &pglogrepl.TupleDataColumn{DataType: pglogrepl.TupleDataTypeBinary, Length: uint32(len(b)), Data: b}
	}
	return &pglogrepl.TupleData{ColumnNum: 8, Columns: []*pglogrepl.TupleDataColumn{
		col(binary.BigEndian.AppendUint64(nil, 123456)),
		col(binary.BigEndian.AppendUint64(nil, 7890)),
		col([]byte{0xa0, 0xee, 0xbc, 0x99, 0x9c, 0x0b, 0x4e, 0xf8, 0xbb, 0x6d, 0x6b, 0xb9, 0xbd, 0x38, 0x0a, 0x11}),
		col([]byte("orders")),
		col([]byte("key-4711")),
		col(bytes.Repeat([]byte("x"), 200)),
		col([]byte("\x01{\"trace-id\": \"abc\"}")),
		col(binary.BigEndian.AppendUint64(nil, 849_414_417_098_123)),
	}}
}

// BenchmarkDecodeInsert decodes one typical outbox insert (200-byte
// payload) from the message bytes, in text and in binary format, through
// the fast path and through pglogrepl and pgtype as every insert was
// before.
func BenchmarkDecodeInsert(b *testing.B) {
	r := outboxRelation(b)
	d := newDecoder()
	for _, format := range []struct {
		name string
		msg  []byte
	}{
		{"text", insertMessage(1, textTuple(sampleValues()...))},
		{"binary", insertMessage(1, binaryTuple())},
	} {
		msg := format.msg
		b.Run(format.name+"/fast", func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if _, err := d.insert(r, msg); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run(format.name+"/pgtype", func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				m, err := pglogrepl.Parse(msg)
				if err != nil {
					b.Fatal(err)
				}
				if _, err := d.event(r, m.(*pglogrepl.InsertMessage).Tuple); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// FuzzInsert compares the fast decoder with the pgtype one on inserts of
// the outbox built from the fuzzed values: all in text format, or all in
// binary format, with NULLs where nulls has the column's bit set (bit 0
// is id, bit 6 created_at). The fast path must give pgtype's event, or an
// error where pgtype gives one too, except for the values it rejects on
// purpose (BC timestamps, uuids not in canonical form).
func FuzzInsert(f *testing.F) {
	for _, v := range [][]string{
		{"123456", "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11", "orders", "key-1", `\x0001ff`, `{"a":"b"}`, "2026-12-01 04:26:57.098123+00"},
		{"-1", "A0EEBC99-9C0B-4EF8-BB6D-6BB9BD380A11", "", "", `\x`, `{}`, "2026-12-01 10:00:00+05:30"},
		{"1", "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11", "t", "k", `\x00`, `{}`, "1880-01-01 00:00:00.5-00:53:28"},
		{"1", "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11", "t", "k", `\x00`, `{}`, "infinity"},
		{"1", "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11", "t", "k", `\x00`, `{}`, "0044-03-15 12:00:00+00 BC"},
		{"1", "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11", "t", "k", `\x00`, `{}`, "12026-12-01 04:26:57.12345678Z"},
	} {
		f.Add(false, uint8(0), []byte(v[0]), []byte(v[1]), []byte(v[2]), []byte(v[3]), []byte(v[4]), []byte(v[5]), []byte(v[6]))
	}
	f.Add(true, uint8(0), binary.BigEndian.AppendUint64(nil, 42), bytes.Repeat([]byte{0xab}, 16), []byte("t"), []byte("k"),
		[]byte{0, 1}, []byte("\x01{}"), binary.BigEndian.AppendUint64(nil, 849_414_417_098_123))
	f.Add(false, uint8(0b0111000), []byte("7"), []byte("a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11"), []byte("t"), []byte(nil), []byte(nil), []byte(nil), []byte("2026-12-01 04:26:57+00"))

	r, err := newRelation(outboxRelationMessage(), "outbox")
	if err != nil {
		f.Fatal(err)
	}
	d := newDecoder()
	f.Fuzz(func(t *testing.T, binaryFormat bool, nulls uint8, id, eventID, topic, key, payload, headers, createdAt []byte) {
		kind := byte(pglogrepl.TupleDataTypeText)
		if binaryFormat {
			kind = pglogrepl.TupleDataTypeBinary
		}
		td := &pglogrepl.TupleData{ColumnNum: 8}
		for i, v := range [][]byte{id, []byte("1"), eventID, topic, key, payload, headers, createdAt} {
			field := r.field[i]
			if i == 1 {
				td.Columns = append(td.Columns, &pglogrepl.TupleDataColumn{DataType: pglogrepl.TupleDataTypeText, Length: 1, Data: v})
				continue
			}
			if nulls&(1<<field) != 0 {
				td.Columns = append(td.Columns, &pglogrepl.TupleDataColumn{DataType: pglogrepl.TupleDataTypeNull})
				continue
			}
			td.Columns = append(td.Columns, &pglogrepl.TupleDataColumn{DataType: kind, Length: uint32(len(v)), Data: v})
		}
		comparePaths(t, r, d, insertMessage(1, td))
	})
}

// FuzzInsertMessage decodes an Insert of the outbox whose tuple is the
// fuzzed bytes, so columns mix kinds and lengths are arbitrary: the
// decoder never panics, and where the framing is sound it agrees with
// pglogrepl and pgtype as in FuzzInsert.
func FuzzInsertMessage(f *testing.F) {
	f.Add(insertMessage(1, textTuple(sampleValues()...))[6:])
	nulls := sampleValues()
	nulls[4], nulls[5], nulls[6] = nil, nil, nil
	f.Add(insertMessage(1, textTuple(nulls...))[6:])
	r, err := newRelation(outboxRelationMessage(), "outbox")
	if err != nil {
		f.Fatal(err)
	}
	d := newDecoder()
	f.Fuzz(func(t *testing.T, tuple []byte) {
		msg := append([]byte{'I', 0, 0, 0, 1, 'N'}, tuple...)
		var cols [numFields]rawColumn
		if err := r.split(msg, &cols); err != nil {
			if _, err := d.insert(r, msg); err == nil {
				t.Fatalf("split fails (%v), insert does not", err)
			}
			return
		}
		comparePaths(t, r, d, msg)
	})
}

// comparePaths decodes msg, a soundly framed Insert of the outbox, with
// the fast path and with pglogrepl and pgtype. The fast path must give
// pgtype's event, or errUnusual, or an error where pgtype fails too or
// where the fast decoder refuses a value on purpose; insert, which falls
// back to pgtype on errUnusual, must then agree.
func comparePaths(t *testing.T, r *relation, d *decoder, msg []byte) {
	t.Helper()
	m, err := pglogrepl.Parse(msg)
	if err != nil {
		t.Fatalf("pglogrepl: %v", err)
	}
	ref, refErr := d.event(r, m.(*pglogrepl.InsertMessage).Tuple)

	var cols [numFields]rawColumn
	if err := r.split(msg, &cols); err != nil {
		t.Fatalf("split: %v", err)
	}
	fast, fastErr := r.fastEvent(&cols)
	switch {
	case errors.Is(fastErr, errUnusual):
	case fastErr == nil && refErr == nil:
		if !sameEvent(fast, ref) {
			t.Fatalf("fast path %+v, pgtype %+v", fast, ref)
		}
	case fastErr == nil:
		t.Fatalf("fast path %+v, pgtype fails: %v", fast, refErr)
	case refErr == nil && !rejectedOnPurpose(&cols):
		t.Fatalf("fast path fails (%v), pgtype reads %+v", fastErr, ref)
	}
	got, err := d.insert(r, msg)
	if (err == nil) != (fastErr == nil || errors.Is(fastErr, errUnusual) && refErr == nil) ||
		err == nil && !sameEvent(got, ref) {
		t.Fatalf("insert = %+v, %v; fast path %v, pgtype %+v, %v", got, err, fastErr, ref, refErr)
	}
}

// rejectedOnPurpose reports values pgtype reads and the fast decoder
// refuses: uuids not in the canonical 8-4-4-4-12 form, timestamps before
// year 1.
func rejectedOnPurpose(cols *[numFields]rawColumn) bool {
	id, created := cols[fieldEventID], cols[fieldCreatedAt]
	if id.kind == kindText {
		if _, err := appendUUIDText(nil, id.data); err != nil {
			return true
		}
	}
	if created.kind == kindBinary {
		_, err := parseTimestamptzBinary(created.data)
		return errors.Is(err, errBC)
	}
	return bytes.HasSuffix(created.data, []byte(" BC"))
}

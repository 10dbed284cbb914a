package cdc

import (
	"bytes"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5/pgtype"
)

// tuple encodes values (column name to value) in the relation's column
// order, in the given format; a nil value is NULL.
func tuple(t *testing.T, rel *pglogrepl.RelationMessage, format int16, values map[string]any) *pglogrepl.TupleData {
	t.Helper()
	m := pgtype.NewMap()
	td := &pglogrepl.TupleData{ColumnNum: uint16(len(rel.Columns))}
	for _, c := range rel.Columns {
		v := values[c.Name]
		if v == nil {
			td.Columns = append(td.Columns, &pglogrepl.TupleDataColumn{DataType: pglogrepl.TupleDataTypeNull})
			continue
		}
		var data []byte
		var err error
		if c.DataType == pgtype.JSONBOID && format == pgtype.BinaryFormatCode {
			data = append([]byte{1}, v.(string)...)
		} else {
			data, err = m.Encode(c.DataType, format, v, nil)
		}
		if err != nil {
			t.Fatalf("encoding %s: %v", c.Name, err)
		}
		kind := pglogrepl.TupleDataTypeText
		if format == pgtype.BinaryFormatCode {
			kind = pglogrepl.TupleDataTypeBinary
		}
		td.Columns = append(td.Columns, &pglogrepl.TupleDataColumn{DataType: kind, Length: uint32(len(data)), Data: data})
	}
	return td
}

func TestDecodeTextAndBinaryInAnyColumnOrder(t *testing.T) {
	// The outbox's columns shuffled, without txid, and with an extra one
	// the decoder must skip.
	rel := outboxRelationMessage()
	columns := map[string]*pglogrepl.RelationMessageColumn{"note": {Name: "note", DataType: pgtype.TextOID}}
	for _, c := range rel.Columns {
		columns[c.Name] = c
	}
	rel.Columns = nil
	for _, name := range []string{"headers", "created_at", "payload", "note", "key", "topic", "event_id", "id"} {
		rel.Columns = append(rel.Columns, columns[name])
	}
	r, err := newRelation(rel, "outbox")
	if err != nil || !r.outbox {
		t.Fatalf("newRelation = %+v, %v", r, err)
	}
	created := time.Date(2024, 5, 1, 10, 11, 12, 123456000, time.UTC)
	uuid := pgtype.UUID{Bytes: [16]byte{0x12, 0x34, 0x56, 0x78, 0x9a, 0xbc, 0xde, 0xf0, 1, 2, 3, 4, 5, 6, 7, 8}, Valid: true}
	values := map[string]any{
		"headers": `{"a": "b"}`, "created_at": created, "payload": []byte{0, 1, 0xff, '\\'}, "note": "x",
		"key": "order-7", "topic": "orders", "event_id": uuid, "id": int64(42),
	}
	d := newDecoder()
	for _, format := range []int16{pgtype.TextFormatCode, pgtype.BinaryFormatCode} {
		td := tuple(t, rel, format, values)
		e, err := d.event(r, td)
		if err != nil {
			t.Fatalf("format %d: %v", format, err)
		}
		if e.ID != 42 || e.EventID != "12345678-9abc-def0-0102-030405060708" || e.Topic != "orders" || string(e.Key) != "order-7" ||
			!bytes.Equal(e.Payload, []byte{0, 1, 0xff, '\\'}) || string(e.Headers) != `{"a": "b"}` || !e.CreatedAt.Equal(created) {
			t.Fatalf("format %d: decoded %+v", format, e)
		}
		fast, err := d.insert(r, insertMessage(rel.RelationID, td))
		if err != nil || !sameEvent(fast, e) {
			t.Fatalf("format %d: insert decoded %+v, %v; event %+v", format, fast, err, e)
		}
		// The event must not share memory with the receive buffer.
		for _, c := range td.Columns {
			for i := range c.Data {
				c.Data[i] = 0
			}
		}
		if string(e.Key) != "order-7" || !bytes.Equal(e.Payload, []byte{0, 1, 0xff, '\\'}) || string(e.Headers) != `{"a": "b"}` {
			t.Fatalf("format %d: event changed with the buffer: %+v", format, e)
		}
	}

	nulls := tuple(t, rel, pgtype.TextFormatCode, map[string]any{"created_at": created, "topic": "t", "event_id": uuid, "id": int64(1)})
	e, err := d.event(r, nulls)
	if err != nil || e.Key != nil || e.Payload != nil || e.Headers != nil {
		t.Fatalf("NULLs decoded as %+v, %v", e, err)
	}
}

func TestRelationWithoutARequiredColumn(t *testing.T) {
	rel := &pglogrepl.RelationMessage{Namespace: "outbox", RelationName: "events", Columns: []*pglogrepl.RelationMessageColumn{
		{Name: "id", DataType: pgtype.Int8OID}, {Name: "topic", DataType: pgtype.TextOID},
	}}
	if _, err := newRelation(rel, "outbox"); err == nil {
		t.Fatal("a relation without event_id was accepted")
	}
	other := &pglogrepl.RelationMessage{Namespace: "public", RelationName: "events"}
	if r, err := newRelation(other, "outbox"); err != nil || r.outbox {
		t.Fatalf("public.events taken for the outbox: %+v, %v", r, err)
	}
}

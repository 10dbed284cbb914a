package cdc

import (
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/outboxrelay/relay/relay"
)

// relation maps the outbox table's columns, by name, to their places in
// the tuples pgoutput sends. The column order of the table is not assumed:
// it comes from the relation message that precedes the first insert of
// every session (and follows any ALTER TABLE).
type relation struct {
	outbox bool
	names  []string
	oids   []uint32
	// at holds each field's index into a tuple's columns; field, the other
	// way round, each column's field or -1 for a column the relay ignores.
	at    [numFields]int
	field []int8
	// fast is true when every field has the type the migrations give it,
	// so the fast decoder can read the inserts.
	fast bool
}

// The outbox columns the relay reads, in the order of requiredColumns.
const (
	fieldID = iota
	fieldEventID
	fieldTopic
	fieldKey
	fieldPayload
	fieldHeaders
	fieldCreatedAt
	numFields
)

var requiredColumns = [numFields]string{"id", "event_id", "topic", "key", "payload", "headers", "created_at"}

// fastTypes are the column types the fast decoder reads, per field.
var fastTypes = [numFields][]uint32{
	fieldID:        {pgtype.Int8OID},
	fieldEventID:   {pgtype.UUIDOID},
	fieldTopic:     {pgtype.TextOID, pgtype.VarcharOID},
	fieldKey:       {pgtype.TextOID, pgtype.VarcharOID},
	fieldPayload:   {pgtype.ByteaOID},
	fieldHeaders:   {pgtype.JSONBOID, pgtype.JSONOID},
	fieldCreatedAt: {pgtype.TimestamptzOID},
}

// newRelation reads a relation message. A relation other than
// <schema>.events is recorded as not the outbox, and its rows are ignored.
func newRelation(m *pglogrepl.RelationMessage, schema string) (*relation, error) {
	r := &relation{}
	if m.Namespace != schema || m.RelationName != "events" {
		return r, nil
	}
	r.outbox = true
	index := map[string]int{}
	for i, c := range m.Columns {
		index[c.Name] = i
		r.names = append(r.names, c.Name)
		r.oids = append(r.oids, c.DataType)
		r.field = append(r.field, -1)
	}
	r.fast = true
	for f, name := range requiredColumns {
		i, ok := index[name]
		if !ok {
			return nil, fmt.Errorf("cdc: the outbox table %s.events has no column %q in the replication stream", schema, name)
		}
		r.at[f], r.field[i] = i, int8(f)
		r.fast = r.fast && slices.Contains(fastTypes[f], r.oids[i])
	}
	return r, nil
}

// decoder turns inserts into events. It has two paths: insert (insert.go)
// reads the message bytes directly for the column types and value forms
// the outbox has; event, through pglogrepl's tuple and a pgtype.Map, reads
// everything else. It is not safe for concurrent use.
type decoder struct {
	types *pgtype.Map
}

func newDecoder() *decoder { return &decoder{types: pgtype.NewMap()} }

// event decodes one inserted tuple through pgtype. Every returned slice is
// a copy: the tuple's bytes belong to the connection's receive buffer.
func (d *decoder) event(r *relation, t *pglogrepl.TupleData) (relay.Event, error) {
	var e relay.Event
	if t == nil || len(t.Columns) != len(r.oids) {
		return e, fmt.Errorf("cdc: insert tuple has %d columns, the relation has %d", columnCount(t), len(r.oids))
	}
	if err := d.scan(r, t, r.at[fieldID], &e.ID); err != nil {
		return e, err
	}
	var id pgtype.UUID
	if err := d.scan(r, t, r.at[fieldEventID], &id); err != nil {
		return e, err
	}
	e.EventID = id.String()
	if err := d.scan(r, t, r.at[fieldTopic], &e.Topic); err != nil {
		return e, err
	}
	var key *string
	if err := d.scan(r, t, r.at[fieldKey], &key); err != nil {
		return e, err
	}
	if key != nil {
		e.Key = []byte(*key)
	}
	if err := d.scanBytes(r, t, r.at[fieldPayload], &e.Payload); err != nil {
		return e, err
	}
	headers, err := jsonText(r.oids[r.at[fieldHeaders]], t.Columns[r.at[fieldHeaders]])
	if err != nil {
		return e, err
	}
	e.Headers = headers
	var created time.Time
	if err := d.scan(r, t, r.at[fieldCreatedAt], &created); err != nil {
		return e, err
	}
	e.CreatedAt = created
	return e, nil
}

func columnCount(t *pglogrepl.TupleData) int {
	if t == nil {
		return 0
	}
	return len(t.Columns)
}

// scan decodes column i in whichever format pgoutput used. A NULL leaves
// dst as it is (nil for pointer targets).
func (d *decoder) scan(r *relation, t *pglogrepl.TupleData, i int, dst any) error {
	c := t.Columns[i]
	switch c.DataType {
	case pglogrepl.TupleDataTypeNull:
		return nil
	case pglogrepl.TupleDataTypeText:
		return wrap(r, i, d.types.Scan(r.oids[i], pgtype.TextFormatCode, c.Data, dst))
	case pglogrepl.TupleDataTypeBinary:
		return wrap(r, i, d.types.Scan(r.oids[i], pgtype.BinaryFormatCode, c.Data, dst))
	default:
		return fmt.Errorf("cdc: column %s of an insert arrived as %q, which an insert never carries", r.names[i], c.DataType)
	}
}

// scanBytes decodes a bytea column into a fresh slice: text format is
// "\x" followed by hex (or the escape format), binary is the raw bytes.
func (d *decoder) scanBytes(r *relation, t *pglogrepl.TupleData, i int, dst *[]byte) error {
	c := t.Columns[i]
	if c.DataType == pglogrepl.TupleDataTypeBinary {
		*dst = append([]byte{}, c.Data...)
		return nil
	}
	return d.scan(r, t, i, dst)
}

func wrap(r *relation, i int, err error) error {
	if err != nil {
		return fmt.Errorf("cdc: decoding column %s of an outbox insert: %w", r.names[i], err)
	}
	return nil
}

// jsonText returns the JSON text of a json or jsonb column, nil for NULL.
// Binary jsonb starts with a version byte (1) before the text.
func jsonText(oid uint32, c *pglogrepl.TupleDataColumn) ([]byte, error) {
	switch c.DataType {
	case pglogrepl.TupleDataTypeNull:
		return nil, nil
	case pglogrepl.TupleDataTypeText:
		return append([]byte{}, c.Data...), nil
	case pglogrepl.TupleDataTypeBinary:
		data := c.Data
		if oid == pgtype.JSONBOID {
			if len(data) == 0 || data[0] != 1 {
				return nil, fmt.Errorf("cdc: headers column: unknown binary jsonb version")
			}
			data = data[1:]
		}
		return append([]byte{}, data...), nil
	default:
		return nil, fmt.Errorf("cdc: headers column arrived as %q, which an insert never carries", c.DataType)
	}
}

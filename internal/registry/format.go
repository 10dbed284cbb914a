package registry

import (
	"crypto/sha256"
	"fmt"
	"strings"
)

// Schema types, as the Confluent API names them (an empty schemaType is
// Avro).
const (
	TypeAvro     = "AVRO"
	TypeJSON     = "JSON"
	TypeProtobuf = "PROTOBUF"
)

// Schema is a parsed schema of one of the supported types.
type Schema interface {
	// Type is TypeAvro, TypeJSON or TypeProtobuf.
	Type() string
	// Fingerprint identifies the schema's canonical form: two texts with
	// the same fingerprint get the same id.
	Fingerprint() [32]byte
	// Validate reports why payload is not a value of the schema (Avro
	// and Protobuf: their binary encodings; JSON Schema: a JSON document).
	Validate(payload []byte) error
}

// Violation is one reason a schema cannot replace another, in plain words.
type Violation struct {
	// Path is where in the schema: a field path ("customer.address.zip")
	// or empty for the root.
	Path    string
	Message string
}

// violations collects what a compatibility check finds. The checks compare
// a reader's schema with a writer's; newIsReader says which is the new one.
type violations struct {
	newIsReader bool
	out         []Violation
}

func (c *violations) add(path, format string, args ...any) {
	c.out = append(c.out, Violation{Path: path, Message: fmt.Sprintf(format, args...)})
}

// oldNew orders reader and writer descriptions as (old, new).
func (c *violations) oldNew(reader, writer string) (string, string) {
	if c.newIsReader {
		return writer, reader
	}
	return reader, writer
}

func (v Violation) String() string {
	if v.Path == "" {
		return v.Message
	}
	return v.Path + ": " + v.Message
}

// NormalizeType maps the API's schemaType to a supported type ("" is
// Avro), or explains why it is not supported.
func NormalizeType(t string) (string, error) {
	switch strings.ToUpper(t) {
	case "", TypeAvro:
		return TypeAvro, nil
	case TypeJSON:
		return TypeJSON, nil
	case TypeProtobuf:
		return TypeProtobuf, nil
	default:
		return "", fmt.Errorf("unknown schema type %q (AVRO, JSON and PROTOBUF are supported)", t)
	}
}

// Parse parses text as a schema of type t (NormalizeType's result).
func Parse(t, text string) (Schema, error) {
	switch t {
	case TypeAvro:
		return parseAvro(text)
	case TypeJSON:
		return parseJSONSchema(text)
	case TypeProtobuf:
		return parseProtobuf(text)
	}
	return nil, fmt.Errorf("unknown schema type %q", t)
}

// readerCompatible lists why data written with writer cannot be read with
// reader; newIsReader says which of the two is the newer schema, for the
// wording.
func readerCompatible(reader, writer Schema, newIsReader bool) []Violation {
	if reader.Type() != writer.Type() {
		old, nw := writer.Type(), reader.Type()
		if !newIsReader {
			old, nw = nw, old
		}
		return []Violation{{Message: fmt.Sprintf("the schema type changed from %s to %s", old, nw)}}
	}
	switch r := reader.(type) {
	case *avroSchema:
		return avroCompatible(r, writer.(*avroSchema), newIsReader)
	case *jsonSchema:
		return jsonCompatible(r, writer.(*jsonSchema), newIsReader)
	case *protoSchema:
		return protoCompatible(r, writer.(*protoSchema), newIsReader)
	}
	return nil
}

func fingerprint(typ string, canonical []byte) [32]byte {
	return sha256.Sum256(append([]byte(typ+"\x00"), canonical...))
}

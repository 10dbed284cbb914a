package registry

import (
	"context"
	"errors"
	"fmt"
	"io/fs"

	"github.com/bufbuild/protocompile"
	"github.com/bufbuild/protocompile/reporter"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protodesc"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/dynamicpb"
)

// protoSchema is a .proto file compiled by bufbuild/protocompile; its
// first message is the schema's message, as in Confluent's registry.
type protoSchema struct {
	md        protoreflect.MessageDescriptor
	canonical []byte
}

const protoFile = "schema.proto"

func parseProtobuf(text string) (*protoSchema, error) {
	c := protocompile.Compiler{
		Resolver: protocompile.WithStandardImports(&protocompile.SourceResolver{
			Accessor: protocompile.SourceAccessorFromMap(map[string]string{protoFile: text}),
		}),
		Reporter: reporter.NewReporter(nil, nil),
	}
	files, err := c.Compile(context.Background(), protoFile)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil, fmt.Errorf("invalid Protobuf schema: %w (imports other than Google's well-known types are schema references, which are not supported)", err)
		}
		return nil, fmt.Errorf("invalid Protobuf schema: %w", err)
	}
	fd := files[0]
	if fd.Messages().Len() == 0 {
		return nil, fmt.Errorf("invalid Protobuf schema: it defines no message")
	}
	fdp := protodesc.ToFileDescriptorProto(fd)
	fdp.SourceCodeInfo = nil
	canonical, err := proto.MarshalOptions{Deterministic: true}.Marshal(fdp)
	if err != nil {
		return nil, fmt.Errorf("invalid Protobuf schema: %w", err)
	}
	return &protoSchema{md: fd.Messages().Get(0), canonical: canonical}, nil
}

func (p *protoSchema) Type() string { return TypeProtobuf }

// Fingerprint is of the file's descriptor without source positions or
// comments.
func (p *protoSchema) Fingerprint() [32]byte { return fingerprint(TypeProtobuf, p.canonical) }

// Validate decodes payload as the message's binary encoding. Fields the
// schema does not name are allowed (as Protobuf readers skip them);
// missing proto2 required fields are not, nor is a field the schema names
// with another wire type (which the decoder would keep as unknown).
func (p *protoSchema) Validate(payload []byte) error {
	m := dynamicpb.NewMessage(p.md)
	if err := proto.Unmarshal(payload, m); err != nil {
		return fmt.Errorf("not a Protobuf encoding of %s: %w", p.md.FullName(), err)
	}
	if err := wrongWireTypes(m); err != nil {
		return fmt.Errorf("not a Protobuf encoding of %s: %w", p.md.FullName(), err)
	}
	return nil
}

// wrongWireTypes finds, in m and the messages in it, unknown fields whose
// number the schema knows.
func wrongWireTypes(m protoreflect.Message) error {
	fields := m.Descriptor().Fields()
	for b := m.GetUnknown(); len(b) > 0; {
		num, typ, n := protowire.ConsumeField(b)
		if n < 0 {
			return protowire.ParseError(n)
		}
		if f := fields.ByNumber(num); f != nil {
			return fmt.Errorf("field %d (%s) has wire type %d, which is not a %s's", num, f.FullName(), typ, describeField(f))
		}
		b = b[n:]
	}
	var err error
	m.Range(func(f protoreflect.FieldDescriptor, v protoreflect.Value) bool {
		switch {
		case f.IsMap():
			if f.MapValue().Message() != nil {
				v.Map().Range(func(_ protoreflect.MapKey, mv protoreflect.Value) bool {
					err = wrongWireTypes(mv.Message())
					return err == nil
				})
			}
		case f.IsList() && f.Message() != nil:
			for i := 0; i < v.List().Len() && err == nil; i++ {
				err = wrongWireTypes(v.List().Get(i).Message())
			}
		case f.Message() != nil:
			err = wrongWireTypes(v.Message())
		}
		return err == nil
	})
	return err
}

// protoCompatible lists why a message written with w cannot be read with
// r: fields are matched by number; a field's kind may change only within
// a group the wire format reads alike (the varints int32, int64, uint32,
// uint64, bool and enums; sint32 and sint64; fixed32 and sfixed32;
// fixed64 and sfixed64; string and bytes); a field may not change between
// repeated and singular, nor move in or out of a oneof; a required
// (proto2) field the writer lacks breaks readers. Fields the reader does
// not know are skipped, so removing a field is compatible, and a number
// reused with another type is caught by the transitive levels.
func protoCompatible(r, w *protoSchema, newIsReader bool) []Violation {
	c := &protoCheck{violations: violations{newIsReader: newIsReader}, seen: map[[2]protoreflect.FullName]bool{}}
	c.message("", r.md, w.md)
	return c.out
}

type protoCheck struct {
	violations
	seen map[[2]protoreflect.FullName]bool
}

func kindGroup(k protoreflect.Kind) string {
	switch k {
	case protoreflect.Int32Kind, protoreflect.Int64Kind, protoreflect.Uint32Kind, protoreflect.Uint64Kind, protoreflect.BoolKind, protoreflect.EnumKind:
		return "varint"
	case protoreflect.Sint32Kind, protoreflect.Sint64Kind:
		return "zigzag"
	case protoreflect.Fixed32Kind, protoreflect.Sfixed32Kind:
		return "fixed32"
	case protoreflect.Fixed64Kind, protoreflect.Sfixed64Kind:
		return "fixed64"
	case protoreflect.StringKind, protoreflect.BytesKind:
		return "bytes"
	}
	return k.String()
}

func describeField(f protoreflect.FieldDescriptor) string {
	if f.Message() != nil {
		return "message " + string(f.Message().FullName())
	}
	if f.Enum() != nil {
		return "enum " + string(f.Enum().FullName())
	}
	return f.Kind().String()
}

func (c *protoCheck) message(path string, r, w protoreflect.MessageDescriptor) {
	key := [2]protoreflect.FullName{r.FullName(), w.FullName()}
	if c.seen[key] {
		return
	}
	c.seen[key] = true
	defer delete(c.seen, key)
	rf, wf := r.Fields(), w.Fields()
	for i := 0; i < rf.Len(); i++ {
		f := rf.Get(i)
		fp := join(path, string(f.Name()))
		g := wf.ByNumber(f.Number())
		if g == nil {
			if f.Cardinality() == protoreflect.Required {
				if c.newIsReader {
					c.add(fp, "required field %d was added", f.Number())
				} else {
					c.add(fp, "required field %d was removed", f.Number())
				}
			}
			continue
		}
		if (f.Cardinality() == protoreflect.Repeated) != (g.Cardinality() == protoreflect.Repeated) || f.IsMap() != g.IsMap() {
			old, nw := c.oldNew(cardinality(f), cardinality(g))
			c.add(fp, "field %d changed from %s to %s", f.Number(), old, nw)
			continue
		}
		if (f.ContainingOneof() == nil) != (g.ContainingOneof() == nil) {
			c.add(fp, "field %d moved into or out of a oneof", f.Number())
		}
		if f.Cardinality() == protoreflect.Required && g.Cardinality() != protoreflect.Required {
			if c.newIsReader {
				c.add(fp, "field %d became required", f.Number())
			} else {
				c.add(fp, "field %d is no longer required, but the old schema requires it", f.Number())
			}
		}
		fm, gm := f.Message(), g.Message()
		switch {
		case fm != nil && gm != nil:
			c.message(fp, fm, gm)
		case fm != nil || gm != nil || kindGroup(f.Kind()) != kindGroup(g.Kind()):
			old, nw := c.oldNew(describeField(f), describeField(g))
			c.add(fp, "field %d changed type from %s to %s", f.Number(), old, nw)
		}
	}
}

func cardinality(f protoreflect.FieldDescriptor) string {
	switch {
	case f.IsMap():
		return "a map"
	case f.Cardinality() == protoreflect.Repeated:
		return "repeated"
	}
	return "singular"
}

package registry

import (
	"context"
	"encoding/binary"
	"strings"
	"testing"

	"github.com/hamba/avro/v2"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/dynamicpb"

	"github.com/outboxrelay/relay/relay"
)

func TestValidator(t *testing.T) {
	ctx := context.Background()
	s, _, _ := newStore(t)
	v1 := avroRecord(fID)
	v2 := avroRecord(fID, fQtyDef)
	reg := func(subject, typ, text string) Version {
		t.Helper()
		v, err := s.Register(ctx, subject, typ, text)
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	r1 := reg("orders-value", TypeAvro, v1)
	p1 := reg("payments-value", TypeJSON, jsonObject(pID+","+pQty, "id"))

	val := NewValidator(ValidatorConfig{Store: s, Topics: []string{"orders", "payments", "unregistered"}, Frame: true})
	if err := val.Refresh(ctx); err != nil {
		t.Fatal(err)
	}
	enc := func(schema string, v any) []byte {
		t.Helper()
		b, err := avro.Marshal(avro.MustParse(schema), v)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	order1 := enc(v1, map[string]any{"id": "o-1"})
	check := func(msg relay.Message, wantID int, wantErr string) {
		t.Helper()
		out, err := val.Validate(msg)
		if wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), wantErr) {
				t.Fatalf("Validate(%s %q) = %v, want an error with %q", msg.Topic, msg.Value, err, wantErr)
			}
			return
		}
		if err != nil {
			t.Fatalf("Validate(%s %q): %v", msg.Topic, msg.Value, err)
		}
		if wantID == 0 {
			if string(out) != string(msg.Value) {
				t.Fatalf("Validate changed a value it should pass through")
			}
			return
		}
		if out[0] != 0 || int(binary.BigEndian.Uint32(out[1:5])) != wantID || string(out[5:]) != string(msg.Value) {
			t.Fatalf("framed value %x, want 00, id %d, payload", out, wantID)
		}
	}
	check(relay.Message{Topic: "orders", Value: order1}, r1.ID, "")
	check(relay.Message{Topic: "orders", Value: append(order1, 0)}, 0, "bytes left over")
	check(relay.Message{Topic: "orders", Value: []byte{0x09}}, 0, "not an Avro encoding")
	check(relay.Message{Topic: "payments", Value: []byte(`{"id":"p-1","qty":3}`)}, p1.ID, "")
	check(relay.Message{Topic: "payments", Value: []byte(`{"id":"p-1","qty":"three"}`)}, 0, "breaks the contract of \"payments-value\" version 1")
	check(relay.Message{Topic: "payments", Value: []byte(`{"id":`)}, 0, "not JSON")
	check(relay.Message{Topic: "unregistered", Value: []byte(`x`)}, 0, `subject "unregistered-value" has no registered schema`)
	check(relay.Message{Topic: "free", Value: []byte(`anything`)}, 0, "")

	// A new version is seen at the next refresh; a row may name the old one.
	r2 := reg("orders-value", TypeAvro, v2)
	order2 := enc(v2, map[string]any{"id": "o-2", "qty": 5})
	check(relay.Message{Topic: "orders", Value: order2}, r1.ID, "bytes left over")
	if err := val.Refresh(ctx); err != nil {
		t.Fatal(err)
	}
	check(relay.Message{Topic: "orders", Value: order2}, r2.ID, "")
	v1Header := []relay.Header{{Key: HeaderSchemaVersion, Value: []byte("1")}}
	check(relay.Message{Topic: "orders", Value: order1, Headers: v1Header}, r1.ID, "")
	check(relay.Message{Topic: "orders", Value: order1, Headers: []relay.Header{{Key: HeaderSchemaVersion, Value: []byte("7")}}}, 0, "names version 7")

	// SchemaID (the CloudEvents dataschema) names the schema Validate
	// checks against: the latest, or the one the header names.
	for _, c := range []struct {
		msg    relay.Message
		id     int
		exists bool
	}{
		{relay.Message{Topic: "orders"}, r2.ID, true},
		{relay.Message{Topic: "orders", Headers: v1Header}, r1.ID, true},
		{relay.Message{Topic: "payments"}, p1.ID, true},
		{relay.Message{Topic: "unregistered"}, 0, false},
		{relay.Message{Topic: "free"}, 0, false},
	} {
		if id, ok := val.SchemaID(c.msg); id != c.id || ok != c.exists {
			t.Errorf("SchemaID(%s %v) = %d %v, want %d %v", c.msg.Topic, c.msg.Headers, id, ok, c.id, c.exists)
		}
	}

	// "*": every registered subject's topic has a contract, others pass.
	all := NewValidator(ValidatorConfig{Store: s, Topics: []string{"*"}})
	if err := all.Refresh(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := all.Validate(relay.Message{Topic: "payments", Value: []byte(`[]`)}); err == nil {
		t.Fatal("* did not check a registered topic")
	}
	if out, err := all.Validate(relay.Message{Topic: "free", Value: []byte(`x`)}); err != nil || string(out) != "x" {
		t.Fatalf("* on an unregistered topic: %q, %v", out, err)
	}
}

// TestAvroValidateRejects: payloads that decode only by luck are refused.
func TestAvroValidateRejects(t *testing.T) {
	s, err := Parse(TypeAvro, avroRecord(fID, fStateAB, fNote))
	if err != nil {
		t.Fatal(err)
	}
	good, err := avro.Marshal(avro.MustParse(avroRecord(fID, fStateAB, fNote)), map[string]any{"id": "x", "state": "B", "note": "n"})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Validate(good); err != nil {
		t.Fatalf("a good payload: %v", err)
	}
	// id "x" is 0x02 'x'; state is the enum index (zigzag); note the
	// union index then the string.
	for name, payload := range map[string][]byte{
		"enum index out of range":  {0x02, 'x', 0x0a, 0x00},
		"union index out of range": {0x02, 'x', 0x02, 0x06},
		"string longer than left":  {0x02, 'x', 0x02, 0x02, 0x20, 'n'},
		"truncated":                good[:len(good)-1],
		"empty":                    {},
	} {
		if err := s.Validate(payload); err == nil {
			t.Errorf("%s: %x accepted", name, payload)
		}
	}
}

// TestValidatorProtobuf: a Protobuf contract, framed with the message
// index as the Confluent wire format has it.
func TestValidatorProtobuf(t *testing.T) {
	ctx := context.Background()
	s, _, _ := newStore(t)
	v, err := s.Register(ctx, "shipments-value", TypeProtobuf, protoMsg(pbID, pbQty))
	if err != nil {
		t.Fatal(err)
	}
	val := NewValidator(ValidatorConfig{Store: s, Topics: []string{"shipments"}, Frame: true})
	if err := val.Refresh(ctx); err != nil {
		t.Fatal(err)
	}
	sch, _ := Parse(TypeProtobuf, protoMsg(pbID, pbQty))
	md := sch.(*protoSchema).md
	m := dynamicpb.NewMessage(md)
	m.Set(md.Fields().ByName("id"), protoreflect.ValueOfString("s-1"))
	m.Set(md.Fields().ByName("qty"), protoreflect.ValueOfInt32(3))
	payload, err := proto.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	out, err := val.Validate(relay.Message{Topic: "shipments", Value: payload})
	if err != nil {
		t.Fatal(err)
	}
	if out[0] != 0 || int(binary.BigEndian.Uint32(out[1:5])) != v.ID || out[5] != 0 || string(out[6:]) != string(payload) {
		t.Fatalf("framed value %x, want 00, id %d, message index 0, payload", out, v.ID)
	}
	// Field 2 as a string (wire type 2) where an int32 (varint) belongs.
	if _, err := val.Validate(relay.Message{Topic: "shipments", Value: []byte{0x12, 0x01, 'x'}}); err == nil || !strings.Contains(err.Error(), "not a Protobuf encoding of shop.Shipment") {
		t.Fatalf("a wrong wire type: %v", err)
	}
	if _, err := val.Validate(relay.Message{Topic: "shipments", Value: []byte{0x0a, 0x05, 'x'}}); err == nil {
		t.Fatal("a truncated payload was accepted")
	}
}

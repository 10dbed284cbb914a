package registry

import (
	"strings"
	"testing"

	"github.com/hamba/avro/v2"
)

// compatCase is a subject's history (oldest first), a new version and the
// verdict at each level; want holds a fragment of the first violation when
// the verdict is "incompatible".
type compatCase struct {
	name    string
	history []string
	next    string
	// ok is the verdict per level; a level missing from it expects
	// incompatible.
	ok   []string
	want string
}

var allLevels = []string{Backward, BackwardTransitive, Forward, ForwardTransitive, Full, FullTransitive, None}

func avroRecord(fields ...string) string {
	return `{"type":"record","name":"Order","namespace":"shop","fields":[` + strings.Join(fields, ",") + `]}`
}

const (
	fID       = `{"name":"id","type":"string"}`
	fQty      = `{"name":"qty","type":"int"}`
	fQtyDef   = `{"name":"qty","type":"int","default":1}`
	fQtyLong  = `{"name":"qty","type":"long"}`
	fQtyStr   = `{"name":"qty","type":"string"}`
	fNote     = `{"name":"note","type":["null","string"],"default":null}`
	fNoteReq  = `{"name":"note","type":"string"}`
	fStateABC = `{"name":"state","type":{"type":"enum","name":"State","symbols":["A","B","C"]}}`
	fStateAB  = `{"name":"state","type":{"type":"enum","name":"State","symbols":["A","B"]}}`
	fStateABd = `{"name":"state","type":{"type":"enum","name":"State","symbols":["A","B"],"default":"A"}}`
	fStateCd  = `{"name":"state","type":{"type":"enum","name":"State","symbols":["A","B","C"],"default":"A"}}`
)

var everyLevel = allLevels

var avroCases = []compatCase{
	{name: "field added with a default", history: []string{avroRecord(fID)}, next: avroRecord(fID, fQtyDef), ok: everyLevel},
	{name: "field added without a default", history: []string{avroRecord(fID)}, next: avroRecord(fID, fQty),
		ok: []string{Forward, ForwardTransitive, None}, want: "qty: field was added without a default"},
	{name: "field with a default removed", history: []string{avroRecord(fID, fQtyDef)}, next: avroRecord(fID), ok: everyLevel},
	{name: "field without a default removed", history: []string{avroRecord(fID, fQty)}, next: avroRecord(fID),
		ok: []string{Backward, BackwardTransitive, None}, want: "qty: field was removed, and the old schema has no default for it"},
	{name: "type changed", history: []string{avroRecord(fID, fQty)}, next: avroRecord(fID, fQtyStr),
		ok: []string{None}, want: "qty: type changed from int to string"},
	{name: "int promoted to long", history: []string{avroRecord(fID, fQty)}, next: avroRecord(fID, fQtyLong),
		ok: []string{Backward, BackwardTransitive, None}, want: "qty: type changed from int to long"},
	{name: "enum symbol removed", history: []string{avroRecord(fID, fStateABC)}, next: avroRecord(fID, fStateAB),
		ok: []string{Forward, ForwardTransitive, None}, want: `state: enum symbol "C" was removed from shop.State`},
	{name: "enum symbol added", history: []string{avroRecord(fID, fStateAB)}, next: avroRecord(fID, fStateABC),
		ok: []string{Backward, BackwardTransitive, None}, want: `state: enum symbol "C" was added to shop.State`},
	{name: "enum symbol added, both with a default", history: []string{avroRecord(fID, fStateABd)}, next: avroRecord(fID, fStateCd), ok: everyLevel},
	{name: "optional made required", history: []string{avroRecord(fID, fNote)}, next: avroRecord(fID, fNoteReq),
		ok: []string{Forward, ForwardTransitive, None}, want: "note: type changed from union [null, string] to string"},
	{name: "record renamed", history: []string{avroRecord(fID)}, next: strings.Replace(avroRecord(fID), `"Order"`, `"Purchase"`, 1),
		ok: []string{None}, want: "named type renamed from shop.Order to shop.Purchase"},
	// v2 gave qty a default, v3 took it away: fine with v2, which has the
	// field, not with v1, which lacks it.
	{name: "transitive: field without a default, absent two versions back",
		history: []string{avroRecord(fID), avroRecord(fID, fQtyDef)}, next: avroRecord(fID, fQty),
		ok: []string{Backward, Forward, ForwardTransitive, Full, None}, want: "field was added without a default (consumers on the new schema cannot read data written with version 1)"},
	// v1 needs qty, v2 gave it a default, v3 removed it: v2's readers use
	// the default, v1's have none.
	{name: "transitive: field removed that an older reader needs",
		history: []string{avroRecord(fID, fQty), avroRecord(fID, fQtyDef)}, next: avroRecord(fID),
		ok: []string{Backward, BackwardTransitive, Forward, Full, None}, want: "field was removed, and the old schema has no default for it (consumers on version 1"},
}

func jsonObject(props string, required ...string) string {
	req := `[]`
	if len(required) > 0 {
		req = `["` + strings.Join(required, `","`) + `"]`
	}
	return `{"type":"object","properties":{` + props + `},"required":` + req + `}`
}

const (
	pID      = `"id":{"type":"string"}`
	pQty     = `"qty":{"type":"integer"}`
	pQtyNum  = `"qty":{"type":"number"}`
	pQtyStr  = `"qty":{"type":"string"}`
	pStateAB = `"state":{"enum":["A","B"]}`
	pStateA  = `"state":{"enum":["A"]}`
)

var jsonCases = []compatCase{
	{name: "optional property added", history: []string{jsonObject(pID, "id")}, next: jsonObject(pID+","+pQty, "id"), ok: everyLevel},
	{name: "required property added", history: []string{jsonObject(pID, "id")}, next: jsonObject(pID+","+pQty, "id", "qty"),
		ok: []string{Forward, ForwardTransitive, None}, want: "qty: property was added as required"},
	{name: "optional property removed", history: []string{jsonObject(pID+","+pQty, "id")}, next: jsonObject(pID, "id"), ok: everyLevel},
	{name: "required property removed", history: []string{jsonObject(pID+","+pQty, "id", "qty")}, next: jsonObject(pID, "id"),
		ok: []string{Backward, BackwardTransitive, None}, want: "qty: property was removed, but the old schema requires it"},
	{name: "type changed", history: []string{jsonObject(pID+","+pQty, "id")}, next: jsonObject(pID+","+pQtyStr, "id"),
		ok: []string{None}, want: "qty: type changed from integer to string"},
	{name: "integer widened to number", history: []string{jsonObject(pID+","+pQty, "id")}, next: jsonObject(pID+","+pQtyNum, "id"),
		ok: []string{Backward, BackwardTransitive, None}, want: "qty: type changed from integer to number"},
	{name: "enum value removed", history: []string{jsonObject(pStateAB)}, next: jsonObject(pStateA),
		ok: []string{Forward, ForwardTransitive, None}, want: "state: enum value B was removed"},
	{name: "enum value added", history: []string{jsonObject(pStateA)}, next: jsonObject(pStateAB),
		ok: []string{Backward, BackwardTransitive, None}, want: "state: enum value B was added"},
	{name: "property removed from a closed schema",
		history: []string{`{"type":"object","properties":{` + pID + `,` + pQty + `},"additionalProperties":false}`},
		next:    `{"type":"object","properties":{` + pID + `},"additionalProperties":false}`,
		ok:      []string{Forward, ForwardTransitive, None}, want: "qty: property was removed, and additional properties are not allowed"},
	// v2 dropped qty (open schema: anything may stand there), v3 brought
	// it back with another type than v1 had.
	{name: "transitive: property back with another type",
		history: []string{jsonObject(pID+","+pQty, "id"), jsonObject(pID, "id")}, next: jsonObject(pID+","+pQtyStr, "id"),
		ok: []string{Backward, Forward, Full, None}, want: "qty: type changed from integer to string (consumers"},
	{name: "transitive: required property dropped, then added back optional",
		history: []string{jsonObject(pID+","+pQty, "id", "qty"), jsonObject(pID+","+pQty, "id")}, next: jsonObject(pID, "id"),
		ok: []string{Backward, BackwardTransitive, Forward, Full, None}, want: "qty: property was removed, but the old schema requires it (consumers on version 1"},
}

func protoMsg(fields ...string) string {
	return "syntax = \"proto3\";\npackage shop;\nmessage Shipment {\n" + strings.Join(fields, "\n") + "\n}\n"
}

func proto2Msg(fields ...string) string {
	return "syntax = \"proto2\";\npackage shop;\nmessage Shipment {\n" + strings.Join(fields, "\n") + "\n}\n"
}

const (
	pbID       = `string id = 1;`
	pbQty      = `int32 qty = 2;`
	pbQty64    = `int64 qty = 2;`
	pbQtyStr   = `string qty = 2;`
	pbQtyRep   = `repeated int32 qty = 2;`
	pbNote     = `string note = 3;`
	pbNoteNum  = `int32 note = 3;`
	pb2ID      = `optional string id = 1;`
	pb2QtyReq  = `required int32 qty = 2;`
	pb2QtyOpt  = `optional int32 qty = 2;`
	pbAddress  = `message Address { string zip = 1; }`
	pbAddrF    = `Address address = 4;`
	pbAddressI = `message Address { int64 zip = 1; }`
)

var protoCases = []compatCase{
	{name: "field added", history: []string{protoMsg(pbID)}, next: protoMsg(pbID, pbQty), ok: everyLevel},
	{name: "field removed", history: []string{protoMsg(pbID, pbQty)}, next: protoMsg(pbID), ok: everyLevel},
	{name: "int32 widened to int64 (both varints)", history: []string{protoMsg(pbID, pbQty)}, next: protoMsg(pbID, pbQty64), ok: everyLevel},
	{name: "type changed", history: []string{protoMsg(pbID, pbQty)}, next: protoMsg(pbID, pbQtyStr),
		ok: []string{None}, want: "qty: field 2 changed type from int32 to string"},
	{name: "singular made repeated", history: []string{protoMsg(pbID, pbQty)}, next: protoMsg(pbID, pbQtyRep),
		ok: []string{None}, want: "qty: field 2 changed from singular to repeated"},
	{name: "nested message field type changed", history: []string{protoMsg(pbID, pbAddress, pbAddrF)}, next: protoMsg(pbID, pbAddressI, pbAddrF),
		ok: []string{None}, want: "address.zip: field 1 changed type from string to int64"},
	{name: "required field added (proto2)", history: []string{proto2Msg(pb2ID)}, next: proto2Msg(pb2ID, pb2QtyReq),
		ok: []string{Forward, ForwardTransitive, None}, want: "qty: required field 2 was added"},
	{name: "required field made optional (proto2)", history: []string{proto2Msg(pb2ID, pb2QtyReq)}, next: proto2Msg(pb2ID, pb2QtyOpt),
		ok: []string{Backward, BackwardTransitive, None}, want: "qty: field 2 is no longer required"},
	// v2 dropped field 3, v3 reused its number with another type.
	{name: "transitive: a removed field's number reused with another type",
		history: []string{protoMsg(pbID, pbNote), protoMsg(pbID)}, next: protoMsg(pbID, pbNoteNum),
		ok: []string{Backward, Forward, Full, None}, want: "note: field 3 changed type from string to int32 (consumers"},
}

func TestCompatibilityProtobuf(t *testing.T) { runCompatCases(t, TypeProtobuf, protoCases, nil) }

func runCompatCases(t *testing.T, typ string, cases []compatCase, oracle func(t *testing.T, level string, next Schema, history []Checked) bool) {
	for _, tc := range cases {
		next, err := Parse(typ, tc.next)
		if err != nil {
			t.Fatalf("%s: new schema: %v", tc.name, err)
		}
		var history []Checked
		for i, h := range tc.history {
			s, err := Parse(typ, h)
			if err != nil {
				t.Fatalf("%s: version %d: %v", tc.name, i+1, err)
			}
			history = append(history, Checked{Version: i + 1, Schema: s})
		}
		for _, level := range allLevels {
			t.Run(tc.name+"/"+level, func(t *testing.T) {
				vs := Check(level, next, history)
				wantOK := contains(tc.ok, level)
				if wantOK && len(vs) > 0 {
					t.Fatalf("want compatible, got %v", vs)
				}
				if !wantOK {
					if len(vs) == 0 {
						t.Fatalf("want incompatible, got no violation")
					}
					if !strings.Contains(vs[0].String(), tc.want) {
						t.Fatalf("first violation %q, want it to contain %q (all: %v)", vs[0], tc.want, vs)
					}
				}
				if oracle != nil && oracle(t, level, next, history) != wantOK {
					t.Fatalf("the reference implementation disagrees: it says compatible=%v", !wantOK)
				}
			})
		}
	}
}

func contains(xs []string, x string) bool {
	for _, y := range xs {
		if y == x {
			return true
		}
	}
	return false
}

// hambaVerdict is hamba/avro's own schema-resolution check applied to the
// level's pairs: an independent implementation of the Avro rules to check
// ours against.
func hambaVerdict(t *testing.T, level string, next Schema, history []Checked) bool {
	if level == None {
		return true
	}
	against := history
	if !strings.HasSuffix(level, "_TRANSITIVE") {
		against = history[len(history)-1:]
	}
	n := next.(*avroSchema).s
	for _, h := range against {
		old := h.Schema.(*avroSchema).s
		if level != Forward && level != ForwardTransitive && avro.NewSchemaCompatibility().Compatible(n, old) != nil {
			return false
		}
		if level != Backward && level != BackwardTransitive && avro.NewSchemaCompatibility().Compatible(old, n) != nil {
			return false
		}
	}
	return true
}

func TestCompatibilityAvro(t *testing.T) { runCompatCases(t, TypeAvro, avroCases, hambaVerdict) }

func TestCompatibilityJSONSchema(t *testing.T) { runCompatCases(t, TypeJSON, jsonCases, nil) }

func TestCompatibilityTypeChange(t *testing.T) {
	a, _ := Parse(TypeAvro, avroRecord(fID))
	j, _ := Parse(TypeJSON, jsonObject(pID))
	vs := Check(Backward, j, []Checked{{Version: 1, Schema: a}})
	if len(vs) != 1 || !strings.Contains(vs[0].Message, "schema type changed from AVRO to JSON") {
		t.Fatalf("got %v", vs)
	}
}

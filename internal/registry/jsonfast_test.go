package registry

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/santhosh-tekuri/jsonschema/v6"
)

var fastSchemas = []string{
	// The schema relay-dev bench --schema validates against (internal/bench).
	`{"$schema":"http://json-schema.org/draft-07/schema#","type":"object","additionalProperties":false,
"properties":{"id":{"type":"string"},"key":{"type":"string"},"qty":{"type":"integer","minimum":0},"state":{"enum":["new","paid","shipped"]},"note":{"type":"string"}},
"required":["id","key","qty","state"]}`,
	`{"type":"object","properties":{"id":{"type":"string","minLength":2,"maxLength":5},"n":{"type":["integer","null"],"minimum":-3,"maximum":40},
"tags":{"type":"array","items":{"enum":["a","b",1,true,null]}},"sub":{"type":"object","properties":{"x":{"type":"number"}},"required":["x"],
"additionalProperties":{"type":"boolean"}}},"required":["id"]}`,
	`{"$schema":"https://json-schema.org/draft/2020-12/schema","type":["object","array"],"items":{"type":"integer","maximum":7},
"properties":{"state":{"enum":["new","paid"]}},"additionalProperties":false}`,
	`{"properties":{"qty":{"type":"integer"},"note":true}}`,
}

// genJSON writes a random JSON value, biased towards the keys and kinds
// the schemas above name.
func genJSON(r *rand.Rand, b *strings.Builder, depth int) {
	keys := []string{"id", "key", "qty", "state", "note", "n", "tags", "sub", "x", "extra", "é"}
	strs := []string{"", "a", "b", "new", "paid", "shipped", "key-1", "evt-0000000123", "ééé", "x\"y", `\u00e9t`, "toolongvalue"}
	nums := []string{"0", "1", "-1", "-3", "-4", "7", "8", "17", "40", "41", "1.0", "2.5", "1e2", "-0", "9223372036854775808", "12345678901234567890"}
	k := r.IntN(8)
	if depth > 2 && k >= 5 {
		k = r.IntN(5)
	}
	switch k {
	case 0:
		b.WriteString("null")
	case 1:
		fmt.Fprint(b, r.IntN(2) == 0)
	case 2, 3:
		b.WriteString(nums[r.IntN(len(nums))])
	case 4:
		fmt.Fprintf(b, "%q", strs[r.IntN(len(strs))])
		if s := strs[r.IntN(len(strs))]; strings.HasPrefix(s, `\u`) {
			b.Reset()
			b.WriteString(`"` + s + `"`)
		}
	case 5:
		b.WriteByte('[')
		for i := range r.IntN(4) {
			if i > 0 {
				b.WriteByte(',')
			}
			genJSON(r, b, depth+1)
		}
		b.WriteByte(']')
	default:
		b.WriteByte('{')
		for i := range r.IntN(6) {
			if i > 0 {
				b.WriteByte(',')
			}
			fmt.Fprintf(b, "%q:", keys[r.IntN(len(keys))])
			genJSON(r, b, depth+1)
		}
		b.WriteByte('}')
	}
}

// genFor writes a value that mostly follows schema (a document), with
// random deviations, so that both valid and nearly valid payloads come.
func genFor(r *rand.Rand, b *strings.Builder, schema any, depth int) {
	m, ok := schema.(map[string]any)
	if !ok || r.IntN(10) == 0 || depth > 3 {
		genJSON(r, b, depth)
		return
	}
	if enum, ok := m["enum"].([]any); ok && r.IntN(5) > 0 {
		fmt.Fprintf(b, "%s", mustJSON(enum[r.IntN(len(enum))]))
		return
	}
	var t string
	switch tt := m["type"].(type) {
	case string:
		t = tt
	case []any:
		t, _ = tt[r.IntN(len(tt))].(string)
	}
	if t == "" {
		if _, ok := m["properties"]; ok {
			t = "object"
		}
	}
	switch t {
	case "object":
		props, _ := m["properties"].(map[string]any)
		req := stringSet(m["required"])
		b.WriteByte('{')
		first := true
		for _, name := range sortedKeys(props) {
			p := 0.5
			if req[name] {
				p = 0.95
			}
			if r.Float64() >= p {
				continue
			}
			if !first {
				b.WriteByte(',')
			}
			first = false
			fmt.Fprintf(b, "%q:", name)
			genFor(r, b, props[name], depth+1)
		}
		if r.IntN(8) == 0 {
			if !first {
				b.WriteByte(',')
			}
			b.WriteString(`"extra":`)
			genFor(r, b, m["additionalProperties"], depth+1)
		}
		b.WriteByte('}')
	case "array":
		b.WriteByte('[')
		for i := range r.IntN(4) {
			if i > 0 {
				b.WriteByte(',')
			}
			genFor(r, b, m["items"], depth+1)
		}
		b.WriteByte(']')
	default:
		genJSON(r, b, 3)
	}
}

func mustJSON(v any) string {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err)
	}
	return string(b)
}

// TestJSONFastPathAgrees: on generated payloads, valid ones and broken
// ones, the fast path never accepts what the library rejects, and it
// accepts most of what the library accepts (else it would be no faster).
func TestJSONFastPathAgrees(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 11))
	for si, text := range fastSchemas {
		s, err := Parse(TypeJSON, text)
		if err != nil {
			t.Fatal(err)
		}
		js := s.(*jsonSchema)
		if js.fast == nil {
			t.Fatalf("schema %d has no fast path", si)
		}
		var libValid, fastValid int
		for i := range 30000 {
			var b strings.Builder
			genFor(r, &b, js.doc, 0)
			doc := b.String()
			switch i % 10 {
			case 8:
				doc = doc[:r.IntN(len(doc)+1)]
			case 9:
				doc += []string{" ", "x", "}", " {}", "1"}[r.IntN(5)]
			}
			val, derr := decodeJSON([]byte(doc))
			if derr == nil {
				derr = js.compiled.Validate(val)
			}
			lib := derr == nil
			fast := js.fast.accepts([]byte(doc))
			if fast && !lib {
				t.Fatalf("schema %d: the fast path accepts %s, which the library rejects: %v", si, doc, derr)
			}
			if lib {
				libValid++
			}
			if fast {
				fastValid++
			}
		}
		t.Logf("schema %d: library accepts %d payloads, the fast path %d of them", si, libValid, fastValid)
		if libValid == 0 || fastValid*2 < libValid {
			t.Fatalf("schema %d: the fast path accepts %d of the %d valid payloads", si, fastValid, libValid)
		}
	}
}

// TestJSONFastPathScope: schemas with keywords it does not know get no
// fast path, and neither does draft 4.
func TestJSONFastPathScope(t *testing.T) {
	for _, text := range []string{
		`{"type":"object","properties":{"id":{"type":"string","pattern":"^a"}}}`,
		`{"$schema":"http://json-schema.org/draft-04/schema#","type":"integer"}`,
		`{"$ref":"#/definitions/x","definitions":{"x":{"type":"string"}}}`,
		`{"type":"number","minimum":1.5}`,
		`{"enum":[{"a":1}]}`,
		`{"anyOf":[{"type":"string"}]}`,
	} {
		s, err := Parse(TypeJSON, text)
		if err != nil {
			t.Fatal(err)
		}
		if s.(*jsonSchema).fast != nil {
			t.Errorf("%s got a fast path", text)
		}
	}
	_ = jsonschema.Draft7
}

// TestDecodeJSON: the library path's parser takes one RFC 8259 document
// with numbers as json.Number, keeps a repeated name's last value, and
// rejects what is not JSON (json-iterator, its predecessor, took "-",
// "2." and "1e" as numbers).
func TestDecodeJSON(t *testing.T) {
	v, err := decodeJSON([]byte(` {"a":1,"b":[true,null,"x\u00e9"],"a":2.50} `))
	if err != nil {
		t.Fatal(err)
	}
	got, _ := json.Marshal(v)
	if string(got) != `{"a":2.50,"b":[true,null,"xé"]}` {
		t.Fatalf("decoded %s", got)
	}
	for _, doc := range []string{``, `-`, `2.`, `1e`, `{"a":1`, `{} x`, `{}{}`, `1 2`, `[1,]`, `{"a" 1}`, `nul`} {
		if v, err := decodeJSON([]byte(doc)); err == nil {
			t.Errorf("%q decoded as %v", doc, v)
		}
	}
}

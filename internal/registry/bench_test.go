package registry

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/hamba/avro/v2"
)

const (
	benchJSONSchema = `{"$schema":"http://json-schema.org/draft-07/schema#","type":"object","additionalProperties":false,
"properties":{"id":{"type":"string"},"key":{"type":"string"},"qty":{"type":"integer","minimum":0},"state":{"enum":["new","paid","shipped"]},"note":{"type":"string"}},
"required":["id","key","qty","state"]}`
	benchAvroSchema = `{"type":"record","name":"BenchEvent","namespace":"relay.bench","fields":[{"name":"id","type":"string"},{"name":"key","type":"string"},
{"name":"qty","type":"int"},{"name":"state","type":{"type":"enum","name":"State","symbols":["new","paid","shipped"]}},{"name":"note","type":"string"}]}`
)

func benchValue() map[string]any {
	return map[string]any{"id": "evt-0000000123", "key": "key-123", "qty": 17, "state": "paid", "note": strings.Repeat("x", 110)}
}

func BenchmarkValidateJSON(b *testing.B) {
	s, err := Parse(TypeJSON, benchJSONSchema)
	if err != nil {
		b.Fatal(err)
	}
	payload, _ := json.Marshal(benchValue())
	b.SetBytes(int64(len(payload)))
	b.ReportAllocs()
	for b.Loop() {
		if err := s.Validate(payload); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkValidateAvro(b *testing.B) {
	s, err := Parse(TypeAvro, benchAvroSchema)
	if err != nil {
		b.Fatal(err)
	}
	payload, err := avro.Marshal(avro.MustParse(benchAvroSchema), benchValue())
	if err != nil {
		b.Fatal(err)
	}
	b.SetBytes(int64(len(payload)))
	b.ReportAllocs()
	for b.Loop() {
		if err := s.Validate(payload); err != nil {
			b.Fatal(err)
		}
	}
}

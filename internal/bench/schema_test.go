package bench

import (
	"testing"

	"github.com/outboxrelay/relay/internal/registry"
)

// The validation benchmarks check, through the registry, the very schemas
// and payloads that relay-dev bench --schema drains, at the bench's
// default payload size, so that their numbers and the bench's can be read
// side by side.

func BenchmarkValidateJSON(b *testing.B) {
	jsonPayload, _, err := benchPayloads(Config{}.WithDefaults().PayloadBytes)
	if err != nil {
		b.Fatal(err)
	}
	benchmarkValidate(b, registry.TypeJSON, benchJSONSchema, jsonPayload)
}

func BenchmarkValidateAvro(b *testing.B) {
	_, avroPayload, err := benchPayloads(Config{}.WithDefaults().PayloadBytes)
	if err != nil {
		b.Fatal(err)
	}
	benchmarkValidate(b, registry.TypeAvro, benchAvroSchema, avroPayload)
}

func benchmarkValidate(b *testing.B, typ, schema string, payload []byte) {
	s, err := registry.Parse(typ, schema)
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

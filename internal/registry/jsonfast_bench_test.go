package registry

import "testing"

// BenchmarkJSONValidate validates a typical event against the bench's
// schema (the fast path accepts it) and an invalid one (the fast path
// declines, the library judges).
func BenchmarkJSONValidate(b *testing.B) {
	s, err := parseJSONSchema(fastSchemas[0])
	if err != nil {
		b.Fatal(err)
	}
	for _, c := range []struct{ name, payload string }{
		{"fast", `{"id":"evt-0000000123","key":"key-1","qty":17,"state":"paid","note":"a note of a few words, as events carry"}`},
		{"library", `{"id":"evt-0000000123","key":"key-1","qty":-17,"state":"paid","note":"a note of a few words, as events carry"}`},
	} {
		payload := []byte(c.payload)
		b.Run(c.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				s.Validate(payload)
			}
		})
	}
}

package protocol

import "github.com/twmb/franz-go/pkg/kmsg"

// APIVersions is one API the listener serves: its key, name and the
// versions it advertises in ApiVersions.
type APIVersions struct {
	Key      int16
	Name     string
	Min, Max int16
}

// Advertised lists every API the listener advertises, by key, as its
// ApiVersions response does (the reference pages are generated from it).
func Advertised() []APIVersions {
	keys := apiVersionKeys()
	out := make([]APIVersions, 0, len(keys))
	for _, k := range keys {
		out = append(out, APIVersions{Key: k.ApiKey, Name: kmsg.NameForKey(k.ApiKey), Min: k.MinVersion, Max: k.MaxVersion})
	}
	return out
}

package replayd

import "encoding/json"

// appendJSONString appends s as encoding/json.Marshal encodes a string. A
// string of printable ASCII with nothing to escape (the usual topic or
// type) is copied as it is; any other is left to encoding/json.
func appendJSONString(b []byte, s string) []byte {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 || c >= 0x7f || c == '"' || c == '\\' || c == '<' || c == '>' || c == '&' {
			enc, _ := json.Marshal(s) // a string always encodes
			return append(b, enc...)
		}
	}
	b = append(b, '"')
	b = append(b, s...)
	return append(b, '"')
}

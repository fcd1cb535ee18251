package replayd

import (
	"encoding/json"
	"strings"
	"testing"
)

var jsonSeeds = []string{
	``, ` `, `null`, `true`, `false`, `nul`, `truex`, `0`, `-0`, `01`, `-`, `1.`, `1.5`, `1e`, `1e+`, `1E-7`,
	`-1.5e10`, `2.`, `.5`, `""`, `"a\"b"`, `"\u00e9"`, `"\u00g9"`, `"\x"`, "\"a\tb\"", "\"\xff\"", `"`,
	`[]`, `[1,]`, `[,1]`, `[1 2]`, ` [ 1 , [ ] , { } ] `, `{}`, `{"a":1}`, `{"a":1,}`, `{"a" 1}`, `{a:1}`,
	`{"a":{"b":[true,false,null]}}`, `{"a":1}x`, `1 2`, "\n{\r\n\t\"a\" : 1\n}\n", `{"a":1`, `[`, `]`,
	`"\/\b\f\n\r\t\\"`, `+1`, `Infinity`, `NaN`, "\x00", "1\x00",
	strings.Repeat("[", maxJSONDepth) + strings.Repeat("]", maxJSONDepth),
	strings.Repeat("[", maxJSONDepth+1) + strings.Repeat("]", maxJSONDepth+1),
	strings.Repeat(`{"a":`, maxJSONDepth) + "1" + strings.Repeat("}", maxJSONDepth),
	strings.Repeat(`{"a":`, maxJSONDepth+1) + "1" + strings.Repeat("}", maxJSONDepth+1),
}

// FuzzValidJSON holds validJSON to encoding/json.Valid's answers.
func FuzzValidJSON(f *testing.F) {
	for _, s := range jsonSeeds {
		f.Add([]byte(s))
	}
	f.Add(benchPayload)
	f.Fuzz(func(t *testing.T, data []byte) {
		if got, want := validJSON(data), json.Valid(data); got != want {
			t.Fatalf("validJSON(%q) = %v, json.Valid says %v", data, got, want)
		}
	})
}

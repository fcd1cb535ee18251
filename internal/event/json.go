package event

// ValidJSON reports whether data is one JSON value (RFC 8259) with only
// white space around it, exactly as encoding/json.Valid does, including its
// nesting limit, without allocating. Publish validates every raw payload, and
// encoding/json's general scanner was about a tenth of the CPU of a busy
// publish path; FuzzValidJSON (the root's json_test.go) holds the two to the
// same answers.
func ValidJSON(data []byte) bool {
	v := jsonValidator{data: data}
	v.space()
	if !v.value(0) {
		return false
	}
	v.space()
	return v.i == len(data)
}

// MaxJSONDepth is encoding/json's nesting limit.
const MaxJSONDepth = 10000

type jsonValidator struct {
	data []byte
	i    int
}

func (v *jsonValidator) space() {
	for v.i < len(v.data) {
		switch v.data[v.i] {
		case ' ', '\t', '\n', '\r':
			v.i++
		default:
			return
		}
	}
}

// next returns the next byte and consumes it, or 0 at the end (0 is never
// valid where a byte is expected).
func (v *jsonValidator) next() byte {
	if v.i >= len(v.data) {
		return 0
	}
	c := v.data[v.i]
	v.i++
	return c
}

func (v *jsonValidator) value(depth int) bool {
	switch c := v.next(); {
	case c == '{':
		return v.object(depth + 1)
	case c == '[':
		return v.array(depth + 1)
	case c == '"':
		return v.string()
	case c == 't':
		return v.literal("rue")
	case c == 'f':
		return v.literal("alse")
	case c == 'n':
		return v.literal("ull")
	case c == '-' || '0' <= c && c <= '9':
		v.i--
		return v.number()
	}
	return false
}

func (v *jsonValidator) object(depth int) bool {
	if depth > MaxJSONDepth {
		return false
	}
	v.space()
	if v.i < len(v.data) && v.data[v.i] == '}' {
		v.i++
		return true
	}
	for {
		if v.next() != '"' || !v.string() {
			return false
		}
		v.space()
		if v.next() != ':' {
			return false
		}
		v.space()
		if !v.value(depth) {
			return false
		}
		v.space()
		switch v.next() {
		case ',':
			v.space()
		case '}':
			return true
		default:
			return false
		}
	}
}

func (v *jsonValidator) array(depth int) bool {
	if depth > MaxJSONDepth {
		return false
	}
	v.space()
	if v.i < len(v.data) && v.data[v.i] == ']' {
		v.i++
		return true
	}
	for {
		if !v.value(depth) {
			return false
		}
		v.space()
		switch v.next() {
		case ',':
			v.space()
		case ']':
			return true
		default:
			return false
		}
	}
}

// string checks the rest of a string whose opening quote was consumed.
func (v *jsonValidator) string() bool {
	for v.i < len(v.data) {
		c := v.data[v.i]
		v.i++
		switch {
		case c == '"':
			return true
		case c < 0x20:
			return false
		case c == '\\':
			switch v.next() {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
			case 'u':
				for range 4 {
					if !isHex(v.next()) {
						return false
					}
				}
			default:
				return false
			}
		}
	}
	return false
}

func isHex(c byte) bool {
	return '0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F'
}

func (v *jsonValidator) literal(rest string) bool {
	if len(v.data)-v.i < len(rest) || string(v.data[v.i:v.i+len(rest)]) != rest {
		return false
	}
	v.i += len(rest)
	return true
}

func (v *jsonValidator) number() bool {
	if v.i < len(v.data) && v.data[v.i] == '-' {
		v.i++
	}
	switch c := v.next(); {
	case c == '0':
	case '1' <= c && c <= '9':
		v.digits()
	default:
		return false
	}
	if v.i < len(v.data) && v.data[v.i] == '.' {
		v.i++
		if !v.digits() {
			return false
		}
	}
	if v.i < len(v.data) && (v.data[v.i] == 'e' || v.data[v.i] == 'E') {
		v.i++
		if v.i < len(v.data) && (v.data[v.i] == '+' || v.data[v.i] == '-') {
			v.i++
		}
		if !v.digits() {
			return false
		}
	}
	return true
}

// digits consumes a run of digits and reports whether there was one.
func (v *jsonValidator) digits() bool {
	start := v.i
	for v.i < len(v.data) && '0' <= v.data[v.i] && v.data[v.i] <= '9' {
		v.i++
	}
	return v.i > start
}

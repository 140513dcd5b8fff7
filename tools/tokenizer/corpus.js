// Deterministic hard-text corpus for tokenizer parity tests (and the mixed text of the benchmark).
// Entries are {t: string} for valid text or {hex: "..."} for raw bytes that are not valid UTF-8.
'use strict';

// mulberry32: a tiny seeded PRNG so the corpus is the same on every run and machine.
function rng(seed) {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

const FRAGMENTS = {
  english: [
    "The quick brown fox jumps over the lazy dog.", "I'm sure they'll say it's fine, we've done it, you'd agree.",
    "HELLO World!!! How ARE you?", "Don't panic -- it's only a test (really).", "e.g. i.e. etc. Mr. Smith's car",
    "She said: \"No way!\" and left...", "state-of-the-art, well-known, 2nd-hand", "I'LL SHE'S WE'RE THEY'VE I'D", "it'ſ OK I'M Ｉ'Ｓ K'K 'ﬅ 'İ'ı",
  ],
  cjk: [
    "我爱自然语言处理。今天天气很好！", "日本語のテキスト、カタカナとひらがな。", "한국어 문장도 포함합니다.",
    "中文，标点；混合English单词和123数字。", "ｆｕｌｌｗｉｄｔｈ　ＡＢＣ　１２３", "繁體中文與简体中文",
  ],
  arabic: ["مرحبا بالعالم، كيف حالك؟", "اللُّغَةُ العَرَبِيَّةُ ١٢٣٤٥", "שלום עולם! עברית"],
  devanagari: ["नमस्ते दुनिया, आप कैसे हैं?", "हिन्दी में क्षत्रिय और ज्ञान", "বাংলা ভাষা", "தமிழ் மொழி"],
  thai: ["สวัสดีครับ ภาษาไทยไม่มีช่องว่างระหว่างคำ", "ພາສາລາວ", "ភាសាខ្មែរ"],
  emoji: [
    "👍🏽 thumbs", "👨‍👩‍👧‍👦 family", "🏳️‍🌈 flag", "❤️‍🔥 heart on fire", "👩🏿‍💻 coder", "🇫🇷🇯🇵 flags",
    "😀😃😄😁", "1️⃣ keycap", "🧑🏻‍🤝‍🧑🏾",
  ],
  combining: [
    "e\u0301 vs \u00e9", "A\u030a\u0323 Å", "n\u0303o\u0308\u0304", "Z\u0337\u0321\u0322a\u0335\u0327l\u0336g\u0334o\u0338",
    "ﬁ ﬂ ㎏ ① ™ ½", "Ⅻ ℌ ℍ", "\u1100\u1161\u11a8 jamo", "İstanbul ß ẞ ǅ",
  ],
  mixed: [
    "Привет, мир! Ελληνικά κείμενα.", "Mixed: abc日本def한국ghi", "Ünïcödé façade naïve café",
    "español: ¿Qué tal? ¡Muy bien!", "Tiếng Việt có dấu", "ქართული ენა", "Հայերեն", "ⲁⲃⲅ 𝔘𝔫𝔦𝔠𝔬𝔡𝔢 𝟘𝟙𝟚",
  ],
  code: [
    "def foo(x):\n    return x ** 2  # square\n", "for (int i = 0; i < n; ++i) {\n\tsum += a[i];\n}",
    "const f = async () => { await fetch('/api?x=1&y=2'); };", "if a != b && c <= d || !e { return Err(\"bad\")? }",
    "SELECT * FROM users WHERE id = 42;", "<div class=\"x\">&nbsp;&lt;tag&gt;</div>", "$ echo $HOME | grep -E '^/h' >> log.txt",
    "    indented\n        more\n\t\ttabs\n", "x=1;y=2;z=x+y*3/4-5%6^7", "{\"key\": [1, 2.5, -3e10, null, true]}",
  ],
  urls: [
    "https://example.com/path/to/page?query=value&other=123#anchor", "http://localhost:8080/v1/chat/completions",
    "mailto:someone@example.org", "ftp://files.example.net/pub/file-1.2.3.tar.gz", "www.huggingface.co/models",
  ],
  specials: [
    "<|im_start|>user\nHello<|im_end|>\n<|im_start|>assistant\n", "text <s> inside </s> text", "<unk> and <pad>",
    "<|begin_of_text|>Hi<|eot_id|>", "<bos><start_of_turn>user\nhey<end_of_turn>", "<|endoftext|>",
    "<｜begin▁of▁sentence｜>ds<｜end▁of▁sentence｜>", "<think>reasoning</think> answer", "<|im_end", "< s >",
    "<s><s></s>", "a<|im_end|>b<|im_end|>c", "<tool_call>{\"name\": \"f\"}</tool_call>", "<|fim_prefix|>x<|fim_suffix|>",
  ],
  // Strings that the synthetic tokenizers' added tokens (lstrip, rstrip, single_word, normalized) react to.
  added: [
    "a [MASK] b  [MASK]c\t[MASK]", "x <sep>   y<sep>\nz", "word words sword word_ (word) -word- WORD", "fix ﬁx prefix ﬁxes",
    "<|im_end|>   text   <|im_end|>\n\n<|im_end|>", "the theme, the. bathe the_", "   [MASK]   <sep>   ",
    "\u093fword word\u4e2d \u{1F600}word \u2460word word\u0301 \u00b2word Ⅻword",
  ],
  whitespace: [" ", "  ", "\t", "\n", "\r\n", "\n\n", "   \n  ", " \t \t", "\u00a0", "\u3000", "\u2009", "\u200b", "\ufeff"],
};

// Raw byte strings that are not valid UTF-8 (hex), each mixed with text.
const INVALID_HEX = [
  "ff", "c328", "e282", "f09f98", "c0af", "eda080", "f4908080", "80bf", "fe ff".replace(' ', ''),
  "48656c6c6fff20776f726c64", "e4b8ade6", "61e28262", "f09f9880f09f", "c3a9c3", "41c2", "eda0bdedb880",
];

function pick(r, arr) { return arr[Math.floor(r() * arr.length)]; }

function randomCodepointString(r, n) {
  // Ranges: ASCII, Latin-1, combining marks, CJK, Hangul, emoji, modifiers, ZWJ/VS, general punctuation.
  const ranges = [[0x20, 0x7e], [0xa0, 0xff], [0x300, 0x36f], [0x4e00, 0x4fff], [0xac00, 0xac80], [0x1f600, 0x1f64f],
    [0x1f3fb, 0x1f3ff], [0x200b, 0x200f], [0xfe0f, 0xfe0f], [0x2000, 0x206f], [0x0900, 0x097f], [0x0e00, 0x0e7f],
    [0x0600, 0x06ff], [0x09, 0x0d], [0x30, 0x39], [0xff01, 0xff5e], [0x1d400, 0x1d4ff]];
  let s = '';
  for (let i = 0; i < n; i++) {
    const [lo, hi] = pick(r, ranges);
    s += String.fromCodePoint(lo + Math.floor(r() * (hi - lo + 1)));
  }
  return s;
}

function makeCorpus() {
  const r = rng(20240601);
  const out = [];
  for (const key of Object.keys(FRAGMENTS)) for (const f of FRAGMENTS[key]) out.push({ t: f, k: key });
  // Numbers of every length 1..24, plus separators.
  let digits = '';
  for (let n = 1; n <= 24; n++) { digits += String(n % 10); if (n % 3 === 0 || n > 18) out.push({ t: `${digits} ${digits}.${n} x${digits}` }); }
  out.push({ t: '3.14159 2,718 1e-9 0x1F -42 +7 1/2 100% $1,000,000.00 ٣٤٥ ४५६ ๑๒๓' });
  // Runs of spaces, tabs and newlines of many lengths, around words.
  for (let n = 1; n <= 9; n += 2) {
    out.push({ t: `a${' '.repeat(n)}b${'\t'.repeat(n)}c${'\n'.repeat(n)}d${' \n'.repeat(n)}e` });
    out.push({ t: `${' '.repeat(n)}lead and trail${' '.repeat(n)}` });
  }
  out.push({ t: ' '.repeat(300) + 'x' }, { t: '\n'.repeat(40) }, { t: 'a'.repeat(700) }, { t: '😀'.repeat(60) });
  out.push({ t: '' }, { t: ' ' }, { t: '\n' }, { t: '▁▁x ▁' }, { t: '<0xE4><0xB8> literal byte tokens' });
  // Random mixes of fragments (seeded).
  const keys = Object.keys(FRAGMENTS);
  for (let i = 0; i < 40; i++) {
    let s = '';
    const k = 2 + Math.floor(r() * 4);
    for (let j = 0; j < k; j++) s += pick(r, FRAGMENTS[pick(r, keys)]) + pick(r, FRAGMENTS.whitespace);
    out.push({ t: s });
  }
  // Random code point soup.
  for (let i = 0; i < 25; i++) out.push({ t: randomCodepointString(r, 4 + Math.floor(r() * 40)) });
  // Invalid UTF-8 byte strings, alone and inside text.
  for (const h of INVALID_HEX) {
    out.push({ hex: h });
    out.push({ hex: Buffer.from('pre ', 'utf8').toString('hex') + h + Buffer.from(' 中文 post', 'utf8').toString('hex') });
  }
  return out;
}

// The text a corpus entry stands for, as npm tokenizers receives it: raw bytes are decoded the way
// Node decodes a Buffer (each maximal invalid subsequence becomes U+FFFD).
function entryText(e) { return e.hex !== undefined ? Buffer.from(e.hex, 'hex').toString('utf8') : e.t; }
function entryBytes(e) { return e.hex !== undefined ? Buffer.from(e.hex, 'hex') : Buffer.from(e.t, 'utf8'); }

// A pronounceable-ish random word (Latin, Cyrillic or CJK letters), 2-12 characters.
function randomWord(r) {
  const sets = ['abcdefghijklmnopqrstuvwxyz', 'etaoinshrdlu', 'абвгдеклмнопрст', '的一是不了人我在有他这中大来上国'];
  const set = sets[Math.floor(r() * sets.length)];
  let w = r() < 0.2 ? set[Math.floor(r() * set.length)].toUpperCase() : '';
  for (let k = 0, n = 2 + Math.floor(r() * 11); k < n; k++) w += set[Math.floor(r() * set.length)];
  return w;
}

// A few MB of mixed text for the benchmark: corpus-like lines of every kind, seeded.
function makeBenchLines(totalBytes) {
  const r = rng(7);
  const keys = Object.keys(FRAGMENTS).filter((k) => k !== 'specials');
  const lines = [];
  let size = 0;
  while (size < totalBytes) {
    let s = '';
    const k = 3 + Math.floor(r() * 12);
    for (let j = 0; j < k; j++) {
      // Mostly English and code, as real prompts are; every script still appears.
      const key = r() < 0.6 ? pick(r, ['english', 'code', 'urls']) : pick(r, keys);
      s += pick(r, FRAGMENTS[key]) + (r() < 0.8 ? ' ' : pick(r, FRAGMENTS.whitespace));
      // Fresh pseudo-words too, so the word caches see misses as on real text.
      if (r() < 0.3) s += randomWord(r) + ' ';
      if (r() < 0.1) s += String(Math.floor(r() * 1e6));
    }
    lines.push(s);
    size += Buffer.byteLength(s, 'utf8') + 1;
  }
  return lines;
}

module.exports = { rng, makeCorpus, entryText, entryBytes, makeBenchLines };

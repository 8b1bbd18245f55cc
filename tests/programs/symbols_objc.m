/* An app's own code as an App Store build has it: Objective-C classes, a metaclass method, a
 * subclass and a category, plus plain C.  Built here for arm64 iOS by clang + ld64.lld (no SDK:
 * a root class of its own), then stripped: tests/integration/test_symbols_objc.py. */
__attribute__((objc_root_class))
@interface MTRoot
+ (int)makeShared:(int)n;
- (int)decode:(int)n;
@end

@implementation MTRoot
+ (int)makeShared:(int)n { return n * 3; }
- (int)decode:(int)n { return n + 1; }
@end

@interface MTImageCoder : MTRoot
- (int)decodeFrame:(int)n;
@end

@implementation MTImageCoder
- (int)decodeFrame:(int)n { return n * 7; }
@end

@interface MTRoot (Caching)
- (int)purgeCache:(int)n;
@end

@implementation MTRoot (Caching)
- (int)purgeCache:(int)n { return n - 2; }
@end

__attribute__((noinline)) int plain_c_function(int x) { return x * 11; }

int main(int argc, char **argv) { (void)argv; return plain_c_function(argc); }
